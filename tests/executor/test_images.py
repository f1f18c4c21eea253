"""The Python base image built from the host, with no registry."""

from __future__ import annotations

from executor.images import PYTHON_IMAGE, ensure_python_image


def test_the_base_image_runs_python_with_its_standard_library(docker_client, python_image):
    assert python_image == PYTHON_IMAGE
    output = docker_client.containers.run(
        PYTHON_IMAGE,
        ["python3", "-c", "import ssl, sqlite3, ctypes, json, socket, zlib; print('ok')"],
        remove=True,
        network_mode="none",
    )
    assert output.decode().strip() == "ok"
    probe = (
        "import importlib.util as u, os; "
        "print(os.environ['PATH'], [u.find_spec(m) is None for m in ('test', 'tkinter', 'json')])"
    )
    shown = docker_client.containers.run(
        PYTHON_IMAGE, ["sh", "-c", f'python3 -c "{probe}"'], remove=True, network_mode="none"
    )
    # A shell for RUN lines; no test suite, no tkinter; the rest of the library is there.
    assert shown.decode().strip() == "/usr/local/bin:/usr/bin:/bin [True, True, False]"
    image = docker_client.images.get(PYTHON_IMAGE)
    assert image.attrs["Size"] < 80 << 20


def test_building_it_again_keeps_the_image_there_is(docker_client, python_image):
    before = docker_client.images.get(PYTHON_IMAGE)
    assert ensure_python_image(docker_client) == before.id
    assert docker_client.images.get(PYTHON_IMAGE).attrs["Created"] == before.attrs["Created"]
