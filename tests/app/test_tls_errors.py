"""A TLS failure between the command line and the daemon is named as one, not as a daemon
that cannot be reached: the fix (the cluster's CA file, the certificate's name) differs."""

from __future__ import annotations

from app.cli import main
from executor.security import Authority


def test_a_client_trusting_another_ca_is_told_the_handshake_failed(api, capsys):
    config = ["--config", str(api.config.path)]
    assert main(["jobs", *config]) == 0  # the cluster's own CA: the call goes through
    capsys.readouterr()
    stranger = Authority.create("another cluster")
    api.config.secrets.ca_cert.write_bytes(stranger.cert_pem)
    assert main(["jobs", *config]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "TLS" in err and str(api.config.secrets.ca_cert) in err
    assert "cannot reach" not in err
