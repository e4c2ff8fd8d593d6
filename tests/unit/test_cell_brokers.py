"""CRONWHEEL_CELL_BROKERS, the router's view of a deployment's brokers for
moves (cronwheel/moves_kafka.py deployment_brokers)."""

from __future__ import annotations

import pytest

from cronwheel.moves_kafka import deployment_brokers


def test_each_cell__bootstrap_and_principal__router_s_protocol(monkeypatch):
    monkeypatch.setenv("CRONWHEEL_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("CRONWHEEL_KAFKA_CA_FILE", "/etc/ca.pem")
    got = deployment_brokers("us=admin:p%40ss%3Aw@k1:9093;k2:9093, eu = ops:x@k-eu:9093")
    assert set(got) == {"us", "eu"}
    assert got["us"].conf == {
        "bootstrap.servers": "k1:9093,k2:9093",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "admin",
        "sasl.password": "p@ss:w",
        "ssl.ca.location": "/etc/ca.pem",
    }
    assert got["eu"].conf["sasl.username"] == "ops"
    assert got["eu"].conf["bootstrap.servers"] == "k-eu:9093"
    assert "p@ss" not in repr(got["us"])


def test_unset_protocol__sasl_ssl(monkeypatch):
    monkeypatch.delenv("CRONWHEEL_KAFKA_SECURITY_PROTOCOL", raising=False)
    assert deployment_brokers("us=a:b@h:1")["us"].conf["security.protocol"] == "SASL_SSL"


@pytest.mark.parametrize(
    "text", ["us=h:9093", "us=admin@h:9093", "us:admin:pw@h:9093", "=a:b@h:1", "us=a:b@"]
)
def test_malformed__value_error_naming_the_cell_not_the_password(text):
    with pytest.raises(ValueError) as e:
        deployment_brokers(text)
    assert "NAME=USER:PASSWORD@HOST:PORT" in str(e.value)
    assert "pw" not in str(e.value)
