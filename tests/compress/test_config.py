"""flopwise.compress.config: the compress section and the seed's pruning block."""

import pytest

from flopwise.compress.config import check_method, parse_compress_config
from flopwise.errors import UserError
from flopwise.config.schema import PruningConfig


def test_seed_pruning_block_means_magnitude_pruning_at_its_sparsity():
    cfg = parse_compress_config(None, PruningConfig(method="magnitude", sparsity=0.6))
    assert cfg.method == "prune" and cfg.sparsity == 0.6 and cfg.scope == "layer"


def test_compress_section_wins_over_pruning_block():
    cfg = parse_compress_config({"method": "int8-static"}, PruningConfig(sparsity=0.6))
    assert cfg.method == "int8-static"


def test_unknown_key_names_compress_key():
    with pytest.raises(UserError) as err:
        parse_compress_config({"sparsityy": 0.5}, source="run.yaml")
    message = str(err.value)
    assert "compress.sparsityy" in message and "unknown key" in message and "\n" not in message


def test_bad_method_lists_allowed():
    with pytest.raises(UserError, match="compress.method.*int8-static"):
        parse_compress_config({"method": "int4"})
    with pytest.raises(UserError, match="allowed: int8-static, int8-dynamic, qat, prune, 2:4"):
        check_method("int4")


def test_out_of_range_value_is_one_line():
    with pytest.raises(UserError, match="compress.sparsity"):
        parse_compress_config({"sparsity": 1.5})


def test_impossible_combinations_fail_before_any_work():
    with pytest.raises(UserError, match="finetune_steps"):
        parse_compress_config({"method": "prune", "schedule": "gradual"})
    with pytest.raises(UserError, match="PT2E flow only"):
        parse_compress_config({"method": "int8-static", "backend": "torchao"})
