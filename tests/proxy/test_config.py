import pytest

from proxy.config import (
    BackendSpec,
    ConfigError,
    KVEventsSource,
    ProxyConfig,
    TimeoutConfig,
    load_fleet,
    parse_backend_arg,
    parse_fleet,
)


def test_fleet_file_backends_and_policy() -> None:
    fleet = parse_fleet("policy: weighted\nbackends:\n  - http://127.0.0.1:1\n"
                        "  - {url: 'http://127.0.0.1:2/', flavor: llamacpp, models: m, weight: 3}\n")
    assert fleet.policy == "weighted"
    assert fleet.backends == (BackendSpec("http://127.0.0.1:1"),
                              BackendSpec("http://127.0.0.1:2", "llamacpp", ("m",), 3.0))


def test_fleet_file_may_nest_under_proxy() -> None:
    fleet = parse_fleet("proxy:\n  policy: round-robin\n  backends: [vllm=http://127.0.0.1:5]\n")
    assert fleet.policy == "round-robin" and fleet.backends[0].flavor == "vllm"


def test_backend_argument_is_url_or_flavor_equals_url() -> None:
    assert parse_backend_arg("http://127.0.0.1:8001/") == BackendSpec("http://127.0.0.1:8001")
    assert parse_backend_arg("llamacpp=http://127.0.0.1:8002").flavor == "llamacpp"


@pytest.mark.parametrize("make,field", [
    (lambda: parse_fleet("backends:\n  - {url: 'http://x:1', flavor: sglang}\n"), "backends[0].flavor"),
    (lambda: BackendSpec("127.0.0.1:80"), "url"),
    (lambda: BackendSpec("http://x:1", weight=0), "weight"),
    (lambda: TimeoutConfig(idle_s=0), "idle_s"),
    (lambda: ProxyConfig(port=70000), "port"),
    (lambda: parse_fleet("backends: {url: x}"), "backends"),
])
def test_invalid_values_name_their_field(make, field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        make()
    assert exc.value.field == field


@pytest.mark.parametrize("text,message", [
    ("backends:\n  - {url: 'http://x:1', models: 5}\n",
     "backends[0].models=5: must be a model name or a list of model names"),
    ("backends:\n  - {url: 'http://x:1', models: [a, 3.1]}\n", "backends[0].models=['a', 3.1]: must be"),
    ("backends:\n  - {url: 'http://x:1'}\n  - {url: 'http://x:2', weight: x}\n",
     "backends[1].weight='x': must be a finite number"),
    ("backends:\n  - {url: 'http://x:1', weight: .inf}\n", "backends[0].weight=inf: must be a finite number"),
    ("backends:\n  - {url: 5}\n", "backends[0].url=5: must be a string"),
    ("backends:\n  - {flavor: vllm}\n", "backends[0].url=None: is required"),
    ("backends:\n  - {url: 'http://x:1', modles: [a]}\n", "backends[0].modles=['a']: unknown key"),
    ("backends: [7]\n", "backends[0]=7: must be a URL or a mapping with a url"),
    ("proxy:\n  backends:\n    - {url: 'ftp://x'}\n", "proxy.backends[0].url='ftp://x': must be http(s)://host:port"),
    ("policy: [round-robin]\nbackends: []\n", "policy=['round-robin']: must be a policy spec"),
    ("- a\n- b\n", "fleet='list': must be a mapping"),
])
def test_a_fleet_file_value_of_the_wrong_type_names_the_file_and_its_path_in_it(tmp_path, text, message):
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_fleet(path)
    assert str(exc.value).startswith(f"{path}: {message}")


@pytest.mark.parametrize("text,where,problem", [
    ("backends: [\n  - {url: x\n", "2:3", "while parsing a flow node, expected the node content, but found '-'"),
    ("backends:\n\t- http://x:1\n", "2:1", "found character '\\t' that cannot start any token"),
    ("policy: a\x00\n", "1:10", "special characters are not allowed"),
])
def test_yaml_syntax_errors_name_file_line_and_column_in_one_line(tmp_path, text, where, problem):
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_fleet(path)
    assert str(exc.value).startswith(f"{path}:{where}: invalid YAML: ") and problem in str(exc.value)
    assert "\n" not in str(exc.value)


def test_a_missing_or_binary_fleet_file_is_a_config_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"absent\.yaml: cannot read: No such file or directory"):
        load_fleet(tmp_path / "absent.yaml")
    binary = tmp_path / "fleet.yaml"
    binary.write_bytes(b"backends: [\xff\xfe]\n")
    with pytest.raises(ConfigError, match=r"fleet\.yaml: not UTF-8 text"):
        load_fleet(binary)


def test_url_credentials_move_out_of_the_url_into_basic_auth() -> None:
    spec = BackendSpec("http://fleet:s3cr%3At@127.0.0.1:8001/")
    assert spec.url == "http://127.0.0.1:8001" and spec.basic_auth == ("fleet", "s3cr:t")
    assert spec.authorization == "Basic ZmxlZXQ6czNjcjp0"  # base64 of fleet:s3cr:t
    assert "s3cr" not in repr(spec)
    keyed = parse_fleet("backends:\n  - {url: 'http://127.0.0.1:1', api_key: sk-1}\n").backends[0]
    assert keyed.authorization == "Bearer sk-1" and "sk-1" not in repr(keyed)
    assert BackendSpec("http://127.0.0.1:1").authorization is None


def test_credential_errors_never_echo_the_secret() -> None:
    for make in (lambda: BackendSpec("ftp://u:s3cret@h:1"), lambda: BackendSpec("http://u:s3cret@h:1", api_key="k"),
                 lambda: BackendSpec("http://u:s3cret@h:x")):
        with pytest.raises(ConfigError) as exc:
            make()
        assert "s3cret" not in str(exc.value)


def test_a_backends_kv_events_endpoint_is_read_with_wildcards_as_its_host():
    fleet = parse_fleet("backends:\n"
                        "  - url: http://10.0.0.5:8000\n    kv_events: tcp://*:5557\n"
                        "  - url: http://10.0.0.6:8000\n"
                        "    kv_events: {endpoint: 'tcp://0.0.0.0:5557', replay_endpoint: 'tcp://*:5558', topic: kv}\n")
    first, second = fleet.backends
    assert first.kv_events == KVEventsSource(endpoint="tcp://10.0.0.5:5557")
    assert second.kv_events == KVEventsSource(endpoint="tcp://10.0.0.6:5557", replay_endpoint="tcp://10.0.0.6:5558",
                                              topic="kv")


def test_a_kv_events_source_follows_vllms_kv_events_config():
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:6000",
              "replay_endpoint": "tcp://*:6001", "topic": ""}
    assert KVEventsSource.from_vllm_config(config, "h") == KVEventsSource("tcp://h:6000", "tcp://h:6001")
    assert KVEventsSource.from_vllm_config({**config, "enable_kv_cache_events": False}, "h") is None
    assert KVEventsSource.from_vllm_config({**config, "publisher": "null"}, "h") is None


def test_a_bad_kv_events_value_names_the_backend_key():
    with pytest.raises(ConfigError, match=r"backends\[0\]\.kv_events"):
        parse_fleet("backends:\n  - url: http://h:1\n    kv_events: 5557\n")
    with pytest.raises(ConfigError, match="ZMQ address"):
        parse_fleet("backends:\n  - url: http://h:1\n    kv_events: http://h:5557\n")
