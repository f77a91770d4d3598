"""Compiled-artifact cache: structural key -> library, in memory and on disk (store.py);
`novaforge cache info|verify|clear` (admin.py)."""

from .store import LibraryCache, cache_key, default_root, library_cache

__all__ = ["LibraryCache", "cache_key", "default_root", "library_cache"]
