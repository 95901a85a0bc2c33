"""flopwise.plan.flag_bounds: physical ranges of the planner's numeric flags."""

import pytest

from flopwise.errors import UserError
from flopwise.plan.flag_bounds import check_flag_values


@pytest.mark.parametrize("values,message", [
    ({"pue": 0.9}, "--pue: 0.9 is outside 1 to 5"),
    ({"memory_reserve_gib": float("inf")}, "--memory-reserve-gib: inf is not a finite number"),
    ({"memory_reserve_gib": -1.0}, "--memory-reserve-gib: -1 is outside"),
    ({"gpus": 10**30}, "--gpus: 1e+30 is outside 1 to 1e+06"),
    ({"efficiency": float("nan")}, "--efficiency: nan is not a finite number"),
    ({"batch_tokens": "1e300"}, "--batch-tokens: 1e300 is above"),
    ({"tokens": "-3"}, "--tokens '-3' is not a count"),
])
def test_out_of_range_flags_are_one_line(values, message):
    with pytest.raises(UserError, match=message.replace("+", r"\+")):
        check_flag_values(values)


def test_defaults_and_unknown_names_pass():
    check_flag_values({"pue": 1.1, "memory_reserve_gib": 2.0, "gpus": None, "top": 5, "tokens": "2T",
                       "as_json": True, "model": "llama2-7b", "something_new": 10**40})
