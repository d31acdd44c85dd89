import pytest

from proxy.config import BackendSpec, ConfigError, ProxyConfig, TimeoutConfig, parse_backend_arg, parse_fleet


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
    (lambda: parse_fleet("backends:\n  - {url: 'http://x:1', flavor: sglang}\n"), "flavor"),
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
