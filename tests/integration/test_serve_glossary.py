"""nmt-serve as a real process with a glossary in its serve config: every request gets it,
through LibreTranslate's API and nmt's, and the translations are nmt-generate's with the
same glossary file; a bad glossary file stops the start with a one-line error naming the
file and the line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest

from tests.integration.serve_process import NMT_SERVE, ServeProcess, nmt_generate

TERMS = "tables\tTische\nchairs\tStühle\nkitchen lamps\tKüchenlampen\n"


@pytest.fixture(scope="module")
def lines(demo_corpus) -> list[str]:
    return (demo_corpus / "test.en").read_text(encoding="utf-8").splitlines()[:12]


@pytest.fixture(scope="module")
def glossary(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("serve-glossary") / "terms.en-de.tsv"
    path.write_text(TERMS, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def offline(tiny_trained_checkpoint, lines, glossary, tmp_path_factory) -> list[str]:
    """nmt-generate glossary=FILE's translations of `lines`."""
    folder = tmp_path_factory.mktemp("serve-glossary-offline")
    return nmt_generate(tiny_trained_checkpoint, lines, folder, f"glossary={glossary}")


def test_the_serve_configs_glossary_is_nmt_generates(
    tiny_trained_checkpoint, glossary, lines, offline
):
    # lines 1, 2 and 4 hold a term: nmt-generate put its target term in
    assert "Tische" in offline[0] and "Küchenlampen" in offline[1] and "Stühle" in offline[3]
    server = ServeProcess(tiny_trained_checkpoint, f"glossary={glossary}")
    try:
        libre = httpx.post(
            f"{server.url}/translate", json={"q": lines, "source": "en", "target": "de"}, timeout=60
        )
        assert libre.status_code == 200 and libre.json() == {"translatedText": offline}
        native = httpx.post(f"{server.url}/v1/translate", json={"texts": lines}, timeout=60)
        best = [r["translations"][0] for r in native.json()["results"]]
        assert [t["text"] for t in best] == offline
        assert all(isinstance(t["constraints_met"], bool) for t in best)
    finally:
        assert server.stop() == 0, server.output()


@pytest.mark.parametrize(
    "content, needle",
    [
        ("tables\tTische\nchairs without a tab\n", "bad.tsv:2"),
        (None, "bad.tsv"),  # no such file
    ],
)
def test_a_bad_glossary_file_stops_the_start(tiny_trained_checkpoint, tmp_path, content, needle):
    bad = tmp_path / "bad.tsv"
    if content is not None:
        bad.write_text(content, encoding="utf-8")
    done = subprocess.run(
        [
            str(NMT_SERVE),
            f"checkpoint={tiny_trained_checkpoint}",
            f"glossary={bad}",
            "port=0",
            "device=cpu",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("nmt-serve: error: ") and needle in lines[0], done.stderr
    assert "serving on" not in done.stdout + done.stderr  # it never bound the port
