"""Security: TLS, mutual TLS and bearer tokens from settings (with certificates generated here by
a throwaway CA), the receive-size limit, bad security settings at start-up, the client library
and CLI over TLS with a token, and no request text in logs above debug level."""

from __future__ import annotations

import datetime
import ipaddress
import logging
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from service.client import Client
from service.errors import StartupError
from service.settings import Settings

TEXT = "Ein Hund rennt durch den Schnee."
TOKEN = "s3cr3t-token-for-tests-0123456789"
OTHER_TOKEN = "another-accepted-token-abcdefghij"


# ----------------------------------------------------------------------------- a throwaway PKI


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: Path, key, cert) -> tuple[Path, Path]:
    key_path, cert_path = path.with_suffix(".key"), path.with_suffix(".pem")
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


class CA:
    def __init__(self, directory: Path, name: str):
        self.dir = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        self.pem, _ = _write(directory / name, self.key, self.cert)

    def issue(self, cn: str, server: bool) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        b = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
        )
        if server:
            b = b.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        return _write(self.dir / f"{cn}", key, b.sign(self.key, hashes.SHA256()))


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca, rogue = CA(d, "test-ca"), CA(d, "rogue-ca")
    server_cert, server_key = ca.issue("server", server=True)
    client_cert, client_key = ca.issue("client", server=False)
    rogue_cert, rogue_key = rogue.issue("intruder", server=False)
    return dict(
        ca=ca.pem,
        rogue_ca=rogue.pem,
        server_cert=server_cert,
        server_key=server_key,
        client_cert=client_cert,
        client_key=client_key,
        rogue_cert=rogue_cert,
        rogue_key=rogue_key,
        dir=d,
    )


def code_of(fn):
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code(), e.value.details()


# ----------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def tls_server(make_server, pki):
    return make_server(tls_cert_file=pki["server_cert"], tls_key_file=pki["server_key"])


def test_tls_server_is_verified_with_the_ca(tls_server, pki):
    with tls_server.client(ca_cert=pki["ca"], timeout=30) as c:
        assert c.translate([TEXT], beam_size=1)[0].text
        assert c.health() == "SERVING"
    with Client(f"localhost:{tls_server.server.port}", ca_cert=pki["ca"], timeout=30) as c:  # DNS SAN too
        assert c.translate([TEXT], beam_size=1)[0].text


def test_tls_server_refuses_plaintext_and_untrusted_clients(tls_server, pki):
    with tls_server.client(timeout=5) as plain:
        code, _ = code_of(lambda: plain.translate([TEXT], beam_size=1))
        assert code == grpc.StatusCode.UNAVAILABLE
    with tls_server.client(ca_cert=pki["rogue_ca"], timeout=5) as wrong_ca:  # the server's cert is not trusted
        code, _ = code_of(lambda: wrong_ca.translate([TEXT], beam_size=1))
        assert code == grpc.StatusCode.UNAVAILABLE
    with tls_server.client(ca_cert=pki["ca"], server_name="not-the-server.example", timeout=5) as wrong_name:
        code, _ = code_of(lambda: wrong_name.translate([TEXT], beam_size=1))
        assert code == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_requires_a_client_certificate_from_the_ca(make_server, pki):
    srv = make_server(tls_cert_file=pki["server_cert"], tls_key_file=pki["server_key"], tls_client_ca_file=pki["ca"])
    with srv.client(ca_cert=pki["ca"], client_cert=pki["client_cert"], client_key=pki["client_key"], timeout=30) as c:
        assert c.translate([TEXT], beam_size=1)[0].text
    with srv.client(ca_cert=pki["ca"], timeout=5) as no_cert:
        code, _ = code_of(lambda: no_cert.translate([TEXT], beam_size=1))
        assert code == grpc.StatusCode.UNAVAILABLE
    with srv.client(ca_cert=pki["ca"], client_cert=pki["rogue_cert"], client_key=pki["rogue_key"], timeout=5) as rogue:
        code, _ = code_of(lambda: rogue.translate([TEXT], beam_size=1))
        assert code == grpc.StatusCode.UNAVAILABLE
    assert srv.wait_idle(5)


# ----------------------------------------------------------------------------- bearer tokens


@pytest.fixture(scope="module")
def token_server(make_server, pki):
    tokens = pki["dir"] / "tokens.txt"
    tokens.write_text(f"# accepted tokens\n\n{OTHER_TOKEN}\n")
    return make_server(auth_token=TOKEN, auth_tokens_file=tokens)


@pytest.mark.parametrize(
    "metadata, problem",
    [
        ((), "authorization: missing"),
        ((("authorization", "Bearer wrong-token-0123456789abcdef"),), "authorization: token not accepted"),
        ((("authorization", f"Basic {TOKEN}"),), "authorization: expected `Bearer TOKEN`"),
        ((("authorization", "Bearer "),), "authorization: expected `Bearer TOKEN`"),
        ((("authorization", f"Bearer {TOKEN[:-1]}"),), "authorization: token not accepted"),
    ],
)
def test_missing_or_wrong_token_is_unauthenticated(token_server, metadata, problem):
    with token_server.client(metadata=metadata, timeout=10) as c:
        for call in (
            lambda: c.translate([TEXT], beam_size=1),
            lambda: list(c.translate_stream(TEXT, beam_size=1)),
            lambda: c.encode([TEXT]),
            c.model_info,
        ):
            code, details = code_of(call)
            assert code == grpc.StatusCode.UNAUTHENTICATED, details
            assert details.startswith(problem), details
            assert TOKEN not in details


def test_valid_tokens_are_accepted_and_health_stays_open(token_server):
    for token in (TOKEN, OTHER_TOKEN):
        with token_server.client(token=token, timeout=30) as c:
            assert c.translate([TEXT], beam_size=1)[0].text
            assert list(c.translate_stream(TEXT, beam_size=1))[-1].final.text
            assert c.encode([TEXT])[0]["tokens"]
            assert c.model_info().name
    with grpc.insecure_channel(token_server.address) as ch:  # probes need no secret
        stub = health_pb2_grpc.HealthStub(ch)
        assert stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == health_pb2.HealthCheckResponse.SERVING
        assert (
            next(stub.Watch(health_pb2.HealthCheckRequest(), timeout=5)).status
            == health_pb2.HealthCheckResponse.SERVING
        )
        with pytest.raises(Exception) as e:  # reflection (a streaming RPC) is not open
            list(ProtoReflectionDescriptorDatabase(ch).get_services())
        assert "UNAUTHENTICATED" in repr(e.value) or "authorization" in repr(e.value)
    codes = {
        s.labels["code"] for s in token_server.server.metrics.requests.collect()[0].samples if s.name.endswith("_total")
    }
    assert "UNAUTHENTICATED" in codes  # refusals are counted like any other status


def test_tls_token_and_client_certificate_through_the_cli(make_server, pki, tmp_path):
    srv = make_server(
        tls_cert_file=pki["server_cert"], tls_key_file=pki["server_key"], tls_client_ca_file=pki["ca"], auth_token=TOKEN
    )
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    cli = [sys.executable, "-m", "mtserve"]
    tls = [
        "--server",
        srv.address,
        "--ca-cert",
        str(pki["ca"]),
        "--client-cert",
        str(pki["client_cert"]),
        "--client-key",
        str(pki["client_key"]),
        "--timeout",
        "30",
    ]
    out = subprocess.run(
        [*cli, "translate", *tls, "--token-file", str(token_file), "--beam", "1", TEXT],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    with srv.client(
        ca_cert=pki["ca"], client_cert=pki["client_cert"], client_key=pki["client_key"], token=TOKEN, timeout=30
    ) as c:
        assert out.stdout.strip() == c.translate([TEXT], beam_size=1)[0].text
    enc = subprocess.run(
        [*cli, "encode", *tls, TEXT],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "MTSERVE_TOKEN": TOKEN},
    )
    assert enc.returncode == 0 and '"tokens"' in enc.stdout, enc.stderr
    refused = subprocess.run(
        [*cli, "translate", *tls, TEXT],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in __import__("os").environ.items() if k != "MTSERVE_TOKEN"},
    )
    assert refused.returncode != 0 and "UNAUTHENTICATED" in refused.stderr and "authorization" in refused.stderr


# ----------------------------------------------------------------------------- bad security settings


def test_security_settings_are_checked(tmp_path, pki):
    from pydantic import ValidationError

    from service.grpc.security import load_tokens, server_credentials

    with pytest.raises(ValidationError, match="tls_cert_file and tls_key_file"):
        Settings(tls_cert_file=pki["server_cert"])
    with pytest.raises(ValidationError, match="tls_client_ca_file"):
        Settings(tls_client_ca_file=pki["ca"])
    not_pem = tmp_path / "junk.pem"
    not_pem.write_text("hello")
    with pytest.raises(StartupError, match="tls_cert_file: .* is not a PEM certificate"):
        server_credentials(Settings(tls_cert_file=not_pem, tls_key_file=pki["server_key"]))
    with pytest.raises(StartupError, match="tls_key_file: cannot read"):
        server_credentials(Settings(tls_cert_file=pki["server_cert"], tls_key_file=tmp_path / "missing.key"))
    with pytest.raises(StartupError, match="at least 16 characters"):
        load_tokens(Settings(auth_token="short"))
    empty = tmp_path / "tokens"
    empty.write_text("# nothing here\n\n")
    with pytest.raises(StartupError, match="holds no token"):
        load_tokens(Settings(auth_tokens_file=empty))
    assert load_tokens(Settings()) == [] and server_credentials(Settings()) is None


def test_serve_with_an_unreadable_certificate_exits_with_one_line(tiny_onnx_dir, pki, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mtserve",
            "serve",
            "--onnx-dir",
            str(tiny_onnx_dir),
            "--model-dir",
            str(tiny_onnx_dir.parent),
            "--address",
            "127.0.0.1:0",
            "--metrics-port",
            "0",
            "--tls-cert-file",
            str(tmp_path / "nope.pem"),
            "--tls-key-file",
            str(pki["server_key"]),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Traceback" not in out and "tls_cert_file: cannot read" in out, out
    assert len([line for line in out.splitlines() if "cannot start" in line]) == 1


# ----------------------------------------------------------------------------- size limits


def test_receive_message_size_limit_is_resource_exhausted(make_server):
    srv = make_server(max_receive_message_bytes=64 * 1024, max_text_bytes=10_000)
    with srv.client(timeout=30) as c:
        code, details = code_of(lambda: c.translate(["Hund " * 20_000], beam_size=1))  # ~100 KB
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        code, details = code_of(lambda: c.translate(["Hund " * 9_000], beam_size=1))  # fits, but too many bytes
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("texts[0]: text exceeds max_text_bytes")
        assert c.translate([TEXT], beam_size=1)[0].text


# ----------------------------------------------------------------------------- logs


def test_no_request_text_in_logs_above_debug(make_server, caplog):
    canary = "Kanarienvogel Zwitscherling"
    srv = make_server()
    failed = []

    def broken(rows):  # one unexpected error, so that the error path logs a traceback
        if not failed:
            failed.append(1)
            raise RuntimeError("injected fault")

    with caplog.at_level(logging.DEBUG):
        srv.intercept_steps(broken)
        with srv.client(timeout=30) as c:
            code, _ = code_of(lambda: c.translate([f"{canary} rennt."], beam_size=1))
            assert code == grpc.StatusCode.INTERNAL
            assert c.translate([f"Der {canary} singt."], beam_size=2)[0].text
            list(c.translate_stream(f"Ein {canary}.", beam_size=1))
            c.encode([canary])
            for bad in ([canary, ""], [canary * 4000]):  # empty; past max_text_bytes (100,000)
                code, details = code_of(lambda bad=bad: c.translate(bad))
                assert code == grpc.StatusCode.INVALID_ARGUMENT and canary not in details
        time.sleep(0.1)
    fmt = logging.Formatter()
    loud = [
        r.getMessage() + (fmt.formatException(r.exc_info) if r.exc_info else "")
        for r in caplog.records
        if r.levelno > logging.DEBUG
    ]
    assert any("injected fault" in text for text in loud)  # the fault was logged, with its traceback...
    for text in loud:  # ...but not the text that caused it
        assert canary not in text, text
