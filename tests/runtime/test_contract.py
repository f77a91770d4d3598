"""The eager contract on the CPU backend and the interpreter (tests/contract_cases.py)."""

from __future__ import annotations

import pytest

from contract_cases import (
    ALIAS_CASES,
    check_aliasing,
    check_attribute_changes,
    check_autocast_modes,
    check_concurrent_first_calls,
    check_constant_output_not_shared,
    check_contiguous_view_of_a_transposed_result,
    check_copies,
    check_dtype_errors,
    check_expanded_input_mutation,
    check_index_error,
    check_inference_mode,
    check_input_mutation,
    check_inputs_sharing_memory,
    check_integer_pow,
    check_module_modes,
    check_mutated_input_then_contiguous,
    check_mutation_from_another_mutated_input,
    check_parameters_seen,
    check_result_read_before_a_later_mutation,
    check_results_of_a_strided_input,
    check_views_of_a_transposed_result,
    check_views_of_an_unreturned_result_in_a_mutating_function,
    check_zero_size_operand_errors,
)

BACKENDS = ["cpu", "interpret"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(ALIAS_CASES))
def test_results_fresh_or_aliased_as_eager(name, backend):
    check_aliasing(name, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_constant_output_is_not_shared_across_calls(backend):
    check_constant_output_not_shared(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_inputs_mutated_as_eager(backend):
    check_input_mutation(backend)


@pytest.mark.parametrize("freeze", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_reassigned_and_updated_parameters_are_seen(backend, freeze):
    check_parameters_seen(backend, freeze)


@pytest.mark.parametrize("freeze", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_deepcopy_and_pickle_of_a_compiled_module(backend, freeze):
    check_copies(backend, freeze)


@pytest.mark.parametrize("freeze,pack_weights", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_inference_mode(backend, freeze, pack_weights):
    check_inference_mode(backend, freeze, pack_weights)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dtype_mismatch_raises_as_eager(backend):
    check_dtype_errors(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrent_first_calls_and_eager_in_another_thread(backend):
    check_concurrent_first_calls(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_integer_pow(backend):
    check_integer_pow(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_index_out_of_range_raises_index_error(backend):
    check_index_error(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_expanded_input_mutated_as_eager(backend):
    check_expanded_input_mutation(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_size_products_keep_eager_errors(backend):
    check_zero_size_operand_errors(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_views_of_a_result_laid_out_otherwise_share_its_storage(backend):
    check_views_of_a_transposed_result(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_view_contiguous_only_in_eagers_layout_of_its_base(backend):
    check_contiguous_view_of_a_transposed_result(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_results_of_a_strided_input_fresh_and_contiguous_as_eager(backend):
    check_results_of_a_strided_input(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_inputs_sharing_memory_mutated_as_eager(backend):
    check_inputs_sharing_memory(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mutated_strided_input_made_contiguous_is_fresh(backend):
    check_mutated_input_then_contiguous(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_result_keeps_the_value_before_a_later_mutation(backend):
    check_result_read_before_a_later_mutation(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_views_of_an_unreturned_result_in_a_mutating_function(backend):
    check_views_of_an_unreturned_result_in_a_mutating_function(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mutation_from_another_mutated_input(backend):
    check_mutation_from_another_mutated_input(backend)


@pytest.mark.parametrize("backend", ["cpu", "interpret"])
def test_autocast_mode_is_part_of_the_program_key(backend):
    check_autocast_modes(backend)


@pytest.mark.parametrize("backend", ["cpu", "interpret"])
def test_training_flags_and_hooks_are_part_of_the_program_key(backend):
    check_module_modes(backend)


@pytest.mark.parametrize("backend", ["cpu", "interpret"])
def test_plain_attributes_and_swapped_submodules_are_part_of_the_program_key(backend):
    check_attribute_changes(backend)
