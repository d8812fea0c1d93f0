"""Gin registration: every listed module exists, families come from models.auto, one list of run modes."""

import gin
import pytest

from pau_jax import experiment, launch
from pau_jax.models import auto


def test_a_misspelled_module_in_the_lists_is_an_error(monkeypatch):
    monkeypatch.setattr(experiment, "_REGISTERED", [])
    monkeypatch.setattr(
        experiment, "CONFIG_MODULES", (*experiment.CONFIG_MODULES, "pau_jax.rl.grpoo")
    )
    with pytest.raises(ModuleNotFoundError, match=r"registers module 'pau_jax\.rl\.grpoo'"):
        experiment.register_configurables()


def test_a_misspelled_entry_module_is_an_error(monkeypatch):
    monkeypatch.setattr(experiment, "_REGISTERED", [])
    monkeypatch.setattr(experiment, "ENTRIES", {"train": ("pau_jax.rl.lop", "train", "train")})
    with pytest.raises(ModuleNotFoundError, match=r"'pau_jax\.rl\.lop'"):
        experiment.register_configurables()


def test_the_model_families_come_from_models_auto():
    expected = {family.config.__module__ for family in auto.ARCHITECTURES.values()}
    assert set(experiment.family_modules()) == expected
    assert not expected & set(experiment.CONFIG_MODULES)  # Not listed by hand as well.
    assert set(experiment.config_modules()) >= expected


def test_every_family_config_is_registered():
    experiment.register_configurables()
    for family in auto.ARCHITECTURES.values():
        cls = family.config
        assert gin.get_configurable(f"{cls.__module__}.{cls.__name__}") is not None


def test_one_list_of_run_modes():
    assert experiment.RUN_MODES == tuple(experiment.ENTRIES)
    assert launch.flags.FLAGS["run_mode"].parser.enum_values == list(experiment.RUN_MODES)
    assert experiment.entry_name("eval") == "pau_jax.experiment.evaluate"


def test_the_learner_temperature_cannot_be_bound_in_gin():
    experiment.register_configurables()
    with pytest.raises(ValueError, match="denylisted kwarg 'temperature'"):
        gin.parse_config("pau_jax.rl.grpo.GRPOConfig.temperature = 0.7")
