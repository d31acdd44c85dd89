"""Fleet specs from YAML files, YAML text, mappings and keywords; bad settings named."""

import pytest

from flotilla.testing.spec import FleetSpec, FleetSpecError, load_fleet_spec

YAML = "fleet:\n  engines: 4\n  flavor: llamacpp\n  policy: prefix-aware\n  engine_options:\n    n_parallel: 2\n"


def test_yaml_file_text_and_mapping_give_the_same_spec(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(YAML)
    from_file, from_name = load_fleet_spec(path), load_fleet_spec(str(path))
    from_text = load_fleet_spec(YAML)
    from_mapping = load_fleet_spec({"engines": 4, "flavor": "llamacpp", "policy": "prefix-aware",
                                    "engine_options": {"n_parallel": 2}})
    assert from_file == from_name == from_text == from_mapping
    assert (from_file.engines, from_file.flavor, from_file.engine_options) == (4, "llamacpp", {"n_parallel": 2})


def test_keywords_override_the_file_and_defaults_fill_the_rest():
    spec = load_fleet_spec(YAML, policy="round-robin", time_scale=0.5)
    assert (spec.engines, spec.policy, spec.time_scale, spec.model, spec.gpu) == (
        4, "round-robin", 0.5, "llama-3.1-8b", "h100")
    assert load_fleet_spec(spec) is spec
    assert load_fleet_spec() == FleetSpec()


@pytest.mark.parametrize(("settings", "field"), [
    ({"engines": 0}, "engines"),
    ({"flavor": "sglang"}, "flavor"),
    ({"time_scale": 0}, "time_scale"),
    ({"scrape_interval_s": -1.0}, "scrape_interval_s"),
    ({"policy": " "}, "policy"),
    ({"replicas": 3}, "replicas"),
])
def test_bad_settings_are_refused_by_name(settings, field):
    with pytest.raises(FleetSpecError) as err:
        load_fleet_spec(**settings)
    assert err.value.field == field


def test_a_yaml_document_that_is_not_a_mapping_is_refused():
    with pytest.raises(FleetSpecError, match="mapping"):
        load_fleet_spec("- engines: 2\n- engines: 3\n")


def test_a_missing_yaml_file_is_reported_as_missing(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_fleet_spec(str(tmp_path / "absent.yaml"))
