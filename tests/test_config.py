"""Tests of nobackfill.config: dataclasses from TOML / YAML with errors naming file and field."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nobackfill.config import ConfigError, from_dict, load_config, read_mapping, to_dict


@dataclass
class Inner:
    width: int = 8
    rate: float = 0.5
    tags: list[str] = field(default_factory=list)


@dataclass
class Outer:
    name: str = "x"
    flag: bool = False
    size: tuple[int, ...] = (1, 2)
    inner: Inner = field(default_factory=Inner)
    maybe: int | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class Required:
    name: str
    steps: int = 1

    def __post_init__(self) -> None:
        if self.steps <= 0:
            raise ValueError(f"steps must be positive, got {self.steps}")


TOML = """
name = "model"
flag = true
size = [3, 4, 5]
maybe = 7

[inner]
width = 32
rate = 1
tags = ["a", "b"]

[extra]
anything = {k = 1}
"""

YAML = """
name: model
flag: true
size: [3, 4, 5]
maybe: 7
inner:
  width: 32
  rate: 1
  tags: [a, b]
extra:
  anything: {k: 1}
"""

EXPECTED = Outer(name="model", flag=True, size=(3, 4, 5), inner=Inner(width=32, rate=1.0, tags=["a", "b"]),
                 maybe=7, extra={"anything": {"k": 1}})


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


@pytest.mark.parametrize("name,text", [("c.toml", TOML), ("c.yaml", YAML), ("c.yml", YAML)])
def test_load_nested(tmp_path, name, text):
    cfg = load_config(Outer, _write(tmp_path, name, text))
    assert cfg == EXPECTED
    assert isinstance(cfg.inner, Inner) and isinstance(cfg.size, tuple)
    assert isinstance(cfg.inner.rate, float) and isinstance(cfg.inner.tags, list)
    assert to_dict(cfg)["inner"]["width"] == 32


def test_defaults_and_empty_files(tmp_path):
    assert load_config(Outer, _write(tmp_path, "e.toml", "")) == Outer()
    assert load_config(Outer, _write(tmp_path, "e.yaml", "")) == Outer()
    assert load_config(Outer, _write(tmp_path, "p.toml", "[inner]\nwidth = 3\n")) == Outer(inner=Inner(width=3))


def test_optional_none(tmp_path):
    assert load_config(Outer, _write(tmp_path, "n.yaml", "maybe: null\n")).maybe is None
    with pytest.raises(ConfigError, match="field 'maybe'"):
        load_config(Outer, _write(tmp_path, "n2.yaml", "maybe: seven\n"))


@pytest.mark.parametrize("name,text,bad", [
    ("u.toml", 'name = "a"\ncolour = "red"\n', "colour"),
    ("u.yaml", "name: a\ncolour: red\n", "colour"),
    ("n.toml", "[inner]\ndepth = 3\n", "depth"),
    ("n.yaml", "inner:\n  depth: 3\n", "depth"),
])
def test_unknown_field_names_file_and_field(tmp_path, name, text, bad):
    path = _write(tmp_path, name, text)
    with pytest.raises(ConfigError) as exc:
        load_config(Outer, path)
    msg = str(exc.value)
    assert str(path) in msg and repr(bad) in msg and "unknown field" in msg


@pytest.mark.parametrize("text,fieldname", [
    ('name = 3\n', "name"),
    ('flag = "yes"\n', "flag"),
    ('size = 3\n', "size"),
    ('size = [1, "two"]\n', "size"),
    ('maybe = 1.5\n', "maybe"),
    ('maybe = true\n', "maybe"),
    ('[inner]\nwidth = "wide"\n', "width"),
    ('[inner]\nwidth = true\n', "width"),
    ('[inner]\nrate = "fast"\n', "rate"),
    ('[inner]\nrate = true\n', "rate"),
    ('[inner]\ntags = "a"\n', "tags"),
    ('inner = 3\n', "inner"),
    ('extra = [1]\n', "extra"),
])
def test_wrong_type_names_field(tmp_path, text, fieldname):
    path = _write(tmp_path, "t.toml", text)
    with pytest.raises(ConfigError) as exc:
        load_config(Outer, path)
    msg = str(exc.value)
    assert f"'{fieldname}'" in msg and str(path) in msg and "expected" in msg


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found") as exc:
        load_config(Outer, tmp_path / "nope.toml")
    assert "nope.toml" in str(exc.value)


def test_unknown_format_and_parse_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown config format"):
        read_mapping(_write(tmp_path, "c.json", "{}"))
    with pytest.raises(ConfigError, match="cannot parse") as exc:
        read_mapping(_write(tmp_path, "bad.toml", "name = \n"))
    assert "bad.toml" in str(exc.value)
    with pytest.raises(ConfigError, match="cannot parse") as exc:
        read_mapping(_write(tmp_path, "bad.yaml", "a: [1, 2\nb: }\n"))
    assert "bad.yaml" in str(exc.value)
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        read_mapping(_write(tmp_path, "list.yaml", "- 1\n- 2\n"))


def test_section(tmp_path):
    path = _write(tmp_path, "s.toml", '[model]\nname = "m"\n[model.inner]\nwidth = 4\n\n[other]\nx = 1\n')
    assert load_config(Outer, path, section="model") == Outer(name="m", inner=Inner(width=4))
    with pytest.raises(ConfigError, match=r"missing section \[train\]"):
        load_config(Outer, path, section="train")
    with pytest.raises(ConfigError) as exc:
        load_config(Outer, path, section="other")
    assert "[other]" in str(exc.value) and "'x'" in str(exc.value) and str(path) in str(exc.value)
    yaml_path = _write(tmp_path, "s.yaml", "model:\n  name: m\nscalar: 3\n")
    assert load_config(Outer, yaml_path, section="model").name == "m"
    with pytest.raises(ConfigError, match="expected a table"):
        load_config(Outer, yaml_path, section="scalar")


def test_required_field_and_post_init_errors(tmp_path):
    with pytest.raises(ConfigError) as exc:
        load_config(Required, _write(tmp_path, "r.toml", "steps = 2\n"))
    assert "r.toml" in str(exc.value) and "name" in str(exc.value)
    with pytest.raises(ConfigError, match="steps must be positive") as exc:
        load_config(Required, _write(tmp_path, "r2.yaml", "name: a\nsteps: 0\n"))
    assert "r2.yaml" in str(exc.value)


def test_from_dict_source_prefix():
    assert from_dict(Inner, {"width": 2}) == Inner(width=2)
    with pytest.raises(ConfigError, match=r"^<config>: unknown field"):
        from_dict(Inner, {"nope": 1})
    with pytest.raises(ConfigError, match=r"^mine: field 'width': expected int"):
        from_dict(Inner, {"width": 1.5}, "mine")


def test_zoo_presets_use_config(tmp_path):
    """Presets are loaded through the same machinery (errors name the preset file)."""
    from nobackfill.encoders.zoo import get_preset

    bad = _write(tmp_path, "p.toml", "[model]\nembed_dims = 3\n")
    with pytest.raises(ConfigError, match="embed_dims") as exc:
        get_preset(bad)
    assert str(bad) in str(exc.value)
    with pytest.raises(ConfigError, match="unknown section"):
        get_preset(_write(tmp_path, "q.toml", "[modle]\n"))
    with pytest.raises(ConfigError, match="unknown preset"):
        get_preset("world-nope")
    with pytest.raises(ConfigError, match="not a multiple"):
        get_preset(_write(tmp_path, "r.toml", "[model]\nimage_size = 60\npatch_size = 16\n"))


# ----------------------------------------------------------------------------- --config / --set layers
def test_build_config_layers_defaults_file_then_sets(tmp_path):
    from nobackfill.compat.xbt import XBTUpgradeConfig
    from nobackfill.config import build_config

    f = _write(tmp_path, "my.toml", "n_pairs = 1000\n[stage2]\nbatch_size = 64\nlr = 3e-4\n[stage1.loop]\nsteps = 20\n")
    cfg = build_config(XBTUpgradeConfig, file=f, sets=["stage2.lr=1e-4", "stage1.noise_std=0.1", "stage2.adapters.lora_rank=4"])
    assert cfg.n_pairs == 1000 and cfg.stage2.batch_size == 64
    assert cfg.stage2.loop.lr == 1e-4  # --set wins over the file; "lr" is the loop's, written one level up
    assert cfg.stage1.loop.steps == 20 and cfg.stage1.noise_std == 0.1 and cfg.stage2.adapters.lora_rank == 4
    assert cfg.stage2.loop.steps == XBTUpgradeConfig().stage2.loop.steps  # untouched keys keep their defaults


def test_build_config_errors_name_their_source(tmp_path):
    from nobackfill.compat.xbt import XBTUpgradeConfig
    from nobackfill.config import build_config

    with pytest.raises(ConfigError, match=r"bad\.toml.*'lr'.*expected float"):
        build_config(XBTUpgradeConfig, file=_write(tmp_path, "bad.toml", "[stage2.loop]\nlr = 'fast'\n"))
    with pytest.raises(ConfigError, match=r"--set.*unknown field.*'nope'"):
        build_config(XBTUpgradeConfig, sets=["stage2.nope=1"])
    with pytest.raises(ConfigError, match=r"--set 'stage2'.*dotted.key=value"):
        build_config(XBTUpgradeConfig, sets=["stage2"])
    with pytest.raises(ConfigError, match=r"--set.*steps must be positive"):
        build_config(XBTUpgradeConfig, sets=["stage1.steps=0"])


def test_parse_value_is_toml_else_text():
    from nobackfill.config import parse_assignments, parse_value

    assert parse_value("1e-4") == 1e-4 and parse_value("true") is True and parse_value("[1, 2]") == [1, 2]
    assert parse_value("layernorm") == "layernorm" and parse_value('"a b"') == "a b"
    assert parse_assignments(["a.b=1", "a.c=x", "d=2"]) == {"a": {"b": 1, "c": "x"}, "d": 2}


def test_updated_is_a_checked_nested_replace():
    from nobackfill.compat.xbt import XBTConfig
    from nobackfill.config import updated

    base = XBTConfig()
    cfg = updated(base, steps=7, batch_size=8, adapters={"seed": 3})
    assert cfg.loop.steps == 7 and cfg.batch_size == 8 and cfg.adapters.seed == 3
    assert base.loop.steps != 7 and base.adapters.seed == 0  # the original is not modified
    with pytest.raises(ConfigError, match="XBTConfig.*phi_train"):
        updated(base, phi_train="everything")


def test_loop_intervals_scale_with_steps():
    from nobackfill.train.loop import LoopConfig

    auto = LoopConfig(steps=400, log_every=0, checkpoint_every=0, eval_every=0)
    assert (auto.log_interval, auto.checkpoint_interval, auto.eval_interval) == (20, 100, 400)
    fixed = LoopConfig(steps=400)
    assert (fixed.log_interval, fixed.checkpoint_interval, fixed.eval_interval) == (50, 250, 500)
    with pytest.raises(ValueError, match="log_every"):
        LoopConfig(log_every=-1)
