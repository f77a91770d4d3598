"""The eager contract on the Triton backend (under TRITON_INTERPRET=1; tests/contract_cases.py)."""

from __future__ import annotations

import pytest

from contract_cases import (
    ALIAS_CASES,
    check_aliasing,
    check_attribute_changes,
    check_autocast_modes,
    check_constant_output_not_shared,
    check_contiguous_view_of_a_transposed_result,
    check_expanded_input_mutation,
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
)

pytestmark = pytest.mark.triton


@pytest.mark.parametrize("name", list(ALIAS_CASES))
def test_results_fresh_or_aliased_as_eager(name):
    check_aliasing(name, "triton")


def test_constant_output_is_not_shared_across_calls():
    check_constant_output_not_shared("triton")


def test_inputs_mutated_as_eager():
    check_input_mutation("triton")


@pytest.mark.parametrize("freeze", [False, True])
def test_reassigned_and_updated_parameters_are_seen(freeze):
    check_parameters_seen("triton", freeze)


def test_integer_pow():
    check_integer_pow("triton")


def test_expanded_input_mutated_as_eager():
    check_expanded_input_mutation("triton")


def test_views_of_a_result_laid_out_otherwise_share_its_storage():
    check_views_of_a_transposed_result("triton")


def test_view_contiguous_only_in_eagers_layout_of_its_base():
    check_contiguous_view_of_a_transposed_result("triton")


def test_results_of_a_strided_input_fresh_and_contiguous_as_eager():
    check_results_of_a_strided_input("triton")


def test_inputs_sharing_memory_mutated_as_eager():
    check_inputs_sharing_memory("triton")


def test_mutated_strided_input_made_contiguous_is_fresh():
    check_mutated_input_then_contiguous("triton")


def test_result_keeps_the_value_before_a_later_mutation():
    check_result_read_before_a_later_mutation("triton")


def test_mutation_from_another_mutated_input():
    check_mutation_from_another_mutated_input("triton")


def test_views_of_an_unreturned_result_in_a_mutating_function():
    check_views_of_an_unreturned_result_in_a_mutating_function("triton")


def test_autocast_mode_is_part_of_the_program_key():
    check_autocast_modes("triton")


def test_training_flags_and_hooks_are_part_of_the_program_key():
    check_module_modes("triton")


def test_plain_attributes_and_swapped_submodules_are_part_of_the_program_key():
    check_attribute_changes("triton")
