"""One arena shared by the large programs of a device (and, on CUDA, a stream).

A compiled program plans its intermediates into an arena. Held per program, the arenas of a
training step's forward and backward (or of the sizes of a dynamic-shape program, or of the
graphs a graph break splits a model into) all stay allocated although only one program runs at a
time; eager, by contrast, reuses freed memory. Programs whose arena exceeds their backend's
threshold therefore run in the `SharedArena` of their device: one buffer, grown to the largest
request, used by one program call at a time (`lock`).

Invariants:
* the buffer is only read or written by a caller holding `lock`; a program's views of it are
  valid only until it grows;
* on growth the old buffer is released before the larger one is allocated: `views` (each
  program's cached views, the Triton runtime's) is cleared and every registered user's
  `release_arena()` is called (the CPU runtime drops its views and rebinds at its next call), so
  no program keeps an old buffer alive;
* the registry holds arenas weakly: the buffer is freed with the last program holding it.
"""

from __future__ import annotations

import threading
import weakref

import torch


class SharedArena:
    _registry: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
    _registry_lock = threading.Lock()

    def __init__(self, device: str) -> None:
        self.device = device
        self.lock = threading.Lock()
        self.owner: int | None = None  # the thread holding `lock` (set by the CPU runtime while it runs)
        self._buf: torch.Tensor | None = None
        self.views: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.users: weakref.WeakSet = weakref.WeakSet()  # objects with release_arena(), told on growth
        self.grown = 0  # how many times the buffer was replaced by a larger one

    @classmethod
    def of(cls, key: tuple) -> SharedArena:
        """The arena of `key` ((device, stream) for Triton programs, cpu_program.CPU_ARENA_KEY for the CPU backend)."""
        with cls._registry_lock:
            arena = cls._registry.get(key)
            if arena is None:
                arena = cls(key[0])
                cls._registry[key] = arena
            return arena

    def held_here(self) -> bool:
        """Does the calling thread hold `lock` already (a program called from inside another)?"""
        return self.owner == threading.get_ident()

    def buffer(self, nbytes: int) -> torch.Tensor:
        """A buffer of at least `nbytes` (call with `lock` held)."""
        if self._buf is None or self._buf.numel() < nbytes:
            if self._buf is not None:
                self.grown += 1
            self._buf = None  # (the old one back to the allocator before the larger one is taken)
            self.views.clear()
            for user in list(self.users):
                user.release_arena()
            self._buf = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return self._buf

    @property
    def nbytes(self) -> int:
        return 0 if self._buf is None else self._buf.numel()
