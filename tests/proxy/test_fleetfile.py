"""The fleet file of `flotilla up`: the packaged default, engine command lines, errors naming fields."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import ConfigError
from proxy.fleetfile import load_up_fleet, parse_up_fleet

ENGINE = "engines:\n  - {flavor: vllm, model: llama-3.1-8b}\n"


def test_the_packaged_default_is_two_autoscaled_vllm_and_one_llama_server_behind_capacity_weighed_routing() -> None:
    fleet = load_up_fleet()
    assert [(g.flavor, g.replicas) for g in fleet.engines] == [("vllm", 2), ("llamacpp", 1)]
    assert fleet.scaled_group() is fleet.engines[0] and fleet.engines[0].min_replicas == 2
    assert fleet.port == 8000 and fleet.policy == "prefix-capacity"
    assert fleet.demo.trace_path().is_file()


def test_vllm_command_carries_model_gpu_layout_and_time_scale() -> None:
    fleet = parse_up_fleet("engines:\n  - {flavor: vllm, model: llama-3.1-70b, gpu: h100, tensor_parallel: 4,"
                           " time_scale: 0.05, args: [--max-num-seqs, 64]}\n")
    argv = fleet.engines[0].command(port=9001, seed=3)
    assert argv[1:5] == ["-m", "fake_engines.vllm.cli", "serve", "llama-3.1-70b"]
    joined = " ".join(argv)
    for part in ("--gpu h100", "--port 9001", "--time-scale 0.05", "--seed 3", "-tp 4", "--max-num-seqs 64"):
        assert part in joined


def test_llama_server_command_names_the_gguf_by_quant_and_serves_the_model_name() -> None:
    fleet = parse_up_fleet("engines:\n  - {flavor: llamacpp, model: llama-3.1-8b, quant: Q8_0, parallel: 2,"
                           " ctx_size: 32768}\n  - {flavor: llamacpp, model: llama-3.1-8b}\n")
    joined = " ".join(fleet.engines[0].command(port=9002))
    for part in ("-m llama-3.1-8b-Q8_0.gguf", "-a llama-3.1-8b", "-np 2", "-c 32768", "--metrics"):
        assert part in joined
    defaults = fleet.engines[1].command(port=9003)  # unset keys leave llama-server's own defaults
    assert "-c" not in defaults and "-np" not in defaults and "-ngl" not in defaults


def test_replicas_default_the_ceiling_and_min_and_max_read_from_the_short_keys() -> None:
    group = parse_up_fleet("engines:\n  - {flavor: vllm, model: llama-3.2-1b, replicas: 2, min: 0, max: 6}\n").engines[0]
    assert (group.min_replicas, group.replicas, group.max_replicas) == (0, 2, 6)
    assert parse_up_fleet(ENGINE).engines[0].max_replicas == 1


def test_relative_demo_trace_resolves_against_the_fleet_files_folder(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(ENGINE + "demo: {trace: traces/t.jsonl, speedup: 5, max_requests: 3}\n")
    demo = load_up_fleet(path).demo
    assert demo.trace_path() == tmp_path / "traces" / "t.jsonl"
    assert (demo.speedup, demo.max_requests) == (5.0, 3)


def test_autoscaler_scales_the_group_whose_min_differs_from_max() -> None:
    fleet = parse_up_fleet("engines:\n  - {flavor: llamacpp, model: llama-3.2-1b}\n"
                           "  - {name: pool, flavor: vllm, model: llama-3.2-1b, min: 1, max: 3}\n"
                           "autoscaler: {policy: 'seed:capacity_rps=4', interval_s: 2}\n")
    assert fleet.scaled_group().name == "pool"
    section = fleet.autoscaler.for_proxy(fleet.scaled_group())
    assert (section["policy"], section["interval_s"], section["min"], section["max"]) == ("seed:capacity_rps=4", 2, 1, 3)
    assert section["engine_cmd"][3:5] == ["serve", "llama-3.2-1b"] and "--port" not in section["engine_cmd"]
    assert (section["flavor"], section["time_scale"]) == ("vllm", 1.0)


def test_each_group_is_weighed_by_its_modelled_capacity_unless_its_weight_is_given() -> None:
    vllm, llama = load_up_fleet().engines
    # an H100 vLLM replica runs hundreds of sequences where the RTX 4090 llama-server runs 4 slots
    assert 10 < vllm.capacity_weight() / llama.capacity_weight() < 30
    fleet = parse_up_fleet("engines:\n  - {flavor: vllm, model: llama-3.2-1b, weight: 2.5, min: 1, max: 2}\n"
                           "autoscaler: {policy: 'seed:capacity_rps=4'}\n")
    assert fleet.engines[0].capacity_weight() == 2.5
    assert fleet.autoscaler.for_proxy(fleet.scaled_group())["weight"] == 2.5  # replicas it starts


@pytest.mark.parametrize(("text", "field"), [
    ("engines:\n  - {flavor: vllm, model: llama-3.2-1b, weight: 0}\n", "engines[0].weight"),
    ("engines:\n  - {flavor: vllm, model: llama-3.2-1b, weight: heavy}\n", "engines[0].weight"),
    (ENGINE + "autoscaler: {weight: 3}\n", "autoscaler.weight"),
    ("engines: []\n", "engines"),
    ("engines:\n  - {model: llama-3.2-1b}\n", "engines[0].flavor"),
    ("engines:\n  - {flavor: sglang, model: llama-3.2-1b}\n", "engines[0].flavor"),
    (ENGINE + "  - {flavor: vllm, model: llama-3.2-1b, replicas: 0}\n", "engines[1].replicas"),
    ("engines:\n  - {flavor: vllm, model: llama-3.2-1b, replicas: 3, max: 2}\n", "engines[0].replicas"),
    ("engines:\n  - {flavor: vllm, model: llama-3.2-1b, min: -1}\n", "engines[0].min"),
    ("engines:\n  - {flavor: vllm, model: llama-3.2-1b, time_scale: 0}\n", "engines[0].time_scale"),
    ("engines:\n  - {flavor: vllm, model: llama-3.2-1b, tensor_parallel: two}\n", "engines[0].tensor_parallel"),
    ("engines:\n  - {flavor: vllm, model: llama-3.2-1b, args: --foo}\n", "engines[0].args"),
    ("engines:\n  - {flavor: vllm, model: llama-3.2-1b, gpus: 2}\n", "engines[0].gpus"),
    ("engines:\n  - {flavor: vllm, model: llama-3.2-1b}\n  - {flavor: vllm, model: llama-3.2-1b, name: vllm-0}\n", "engines[1].name"),
    ("engines:\n  - {flavor: vllm, model: llama-3.2-1b, name: proxy}\n", "engines[0].name"),
    (ENGINE + "proxy: {port: 70000}\n", "proxy.port"),
    (ENGINE + "proxy: {backends: [{url: 'ftp://x'}]}\n", "proxy.backends[0].url"),
    (ENGINE + "autoscaler: {actuator: docker}\n", "autoscaler.actuator"),
    (ENGINE + "autoscaler: {engines: nope}\n", "autoscaler.engines"),
    (ENGINE + "autoscaler: {policy: no-such-policy}\n", "autoscaler.policy"),
    (ENGINE + "autoscaler: {policy: 'seed:capacity_rps=-1'}\n", "autoscaler.policy"),
    (ENGINE + "autoscaler: {interval_s: 0}\n", "autoscaler.interval_s"),
    (ENGINE + "autoscaler: {engine_cmd: vllm serve x}\n", "autoscaler.engine_cmd"),
    (ENGINE + "autoscaler: {colour: red}\n", "autoscaler.colour"),
    (ENGINE + "demo: {speedup: -1}\n", "demo.speedup"),
    (ENGINE + "demo: {max_requests: 0}\n", "demo.max_requests"),
    (ENGINE + "router: {}\n", "router"),
    ("engines:\n  - {flavor: vllm, model: llama-9b}\n", "engines[0].model"),
    ("engines:\n  - {flavor: llamacpp, model: llama-9b}\n", "engines[0].model"),
    ("engines:\n  - {flavor: vllm, model: llama-3.1-8b, gpu: tpu}\n", "engines[0].gpu"),
    ("engines:\n  - {flavor: llamacpp, model: llama-3.1-8b, quant: Q9}\n", "engines[0].quant"),
    (ENGINE + "proxy: {policy: no-such-policy}\n", "proxy.policy"),
    (ENGINE + "proxy: {policy: 'round-robin:colour=red'}\n", "proxy.policy"),
    ("engines:\n  - {flavor: vllm, model: llama-3.2-1b, args: [--max-num-seqs, many]}\n", "engines[0].args"),
    ("engines:\n  - {flavor: llamacpp, model: llama-3.2-1b, args: [--colour, red]}\n", "engines[0].args"),
    ("engines:\n  - {flavor: vllm, model: llama-3.2-1b, args: [--max-num-seqs, '0']}\n", "engines[0].args"),
    (ENGINE + "proxy: {colour: red}\n", "proxy.colour"),
    (ENGINE + "proxy: {scrape_interval_s: 0}\n", "proxy.scrape_interval_s"),
    (ENGINE + "slo: {ttft_s: 0}\n", "slo.ttft_s"),
    (ENGINE + "slo: {ttft: 1}\n", "slo.ttft"),
    (ENGINE + "slo: 5\n", "slo"),
    ("- just a list\n", "fleet"),
    ("engines: [\n", "fleet"),
])
def test_invalid_values_name_the_field(text: str, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_up_fleet(text)
    assert err.value.field == field


def test_a_model_path_or_an_explicit_shape_passes_the_catalogue_check_as_fake_vllm_reads_it() -> None:
    fleet = parse_up_fleet("engines:\n  - {flavor: vllm, model: /models/Llama-3.1-8B}\n"
                           "  - {flavor: vllm, model: my-model, args: [--params, 1e9, --layers, 8, --kv-heads, 2]}\n")
    assert [g.model for g in fleet.engines] == ["/models/Llama-3.1-8B", "my-model"]


def test_a_catalogue_error_lists_the_valid_names() -> None:
    with pytest.raises(ConfigError, match=r"engines\[0\]\.gpu='tpu': is not in the catalogue \(.*h100.*\)"):
        parse_up_fleet("engines:\n  - {flavor: vllm, model: llama-3.1-8b, gpu: tpu}\n")


@pytest.mark.parametrize("text,message", [
    (ENGINE.replace("}", ", replicas: null}"), "engines[0].replicas=None: must be int"),
    (ENGINE.replace("}", ", args: 5}"), "engines[0].args=5: must be a list of flags"),
    (ENGINE.replace("}", ", time_scale: .inf}"), "engines[0].time_scale=inf: must be a finite number"),
    (ENGINE + "proxy: 5\n", "proxy=5: must be a mapping"),
    (ENGINE + "proxy: {backends: [{url: 'http://127.0.0.1:1', models: 5}]}\n", "proxy.backends[0].models=5: must be"),
    (ENGINE + "autoscaler: {signals: 5}\n", "autoscaler.signals=5: must be a list of signal names"),
    (ENGINE + "autoscaler: {policy: [kpa]}\n", "autoscaler.policy=['kpa']: must be a policy spec"),
    (ENGINE + "autoscaler: {interval_s: soon}\n", "autoscaler.interval_s='soon': must be a number"),
    (ENGINE + "autoscaler: {hold: 5}\n", "autoscaler.hold=5: must be a mapping"),
    (ENGINE + "autoscaler: {hold: {max_wait_s: x}}\n", "autoscaler.hold.max_wait_s='x': must be a number"),
])
def test_a_value_of_the_wrong_type_is_a_config_error_naming_file_and_field(tmp_path: Path, text: str,
                                                                           message: str) -> None:
    # before issue 16 these raised TypeError or AttributeError: a traceback from `flotilla up`
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_up_fleet(path)
    assert str(err.value).startswith(f"{path}: {message}")


def test_yaml_syntax_errors_and_missing_files_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(ENGINE + "proxy: {port: 8000\n")
    with pytest.raises(ConfigError, match=rf"^{path}:4:1: invalid YAML: while parsing a flow mapping"):
        load_up_fleet(path)
    with pytest.raises(ConfigError, match=r"absent\.yaml: cannot read: No such file or directory"):
        load_up_fleet(tmp_path / "absent.yaml")


def test_slo_and_scrape_interval_and_a_seed_flag_are_part_of_the_fleet() -> None:
    fleet = parse_up_fleet("engines:\n  - {flavor: vllm, model: llama-3.2-1b, args: [--seed, '7']}\n"
                           "proxy: {scrape_interval_s: 0.5}\nslo: {ttft_s: 2, tpot_s: 0.1}\n")
    assert (fleet.slo.ttft_s, fleet.slo.tpot_s, fleet.slo.e2e_s) == (2.0, 0.1, None)
    assert fleet.scrape_interval_s == 0.5 and fleet.engines[0].engine_config().seed == 7  # later flags win


def test_a_bad_engine_flag_is_named_by_the_engines_own_parser() -> None:
    with pytest.raises(ConfigError, match=r"engines\[0\]\.args=\['--max-num-seqs', 'many'\]: .*--max-num-seqs: "
                                          r"invalid int value: 'many'"):
        parse_up_fleet("engines:\n  - {flavor: vllm, model: llama-3.2-1b, args: [--max-num-seqs, many]}\n")
