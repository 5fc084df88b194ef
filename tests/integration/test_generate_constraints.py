"""nmt-generate constraints= and glossary= as a real process on the suite's tiny trained
model: every phrase of a line whose constraints were met is in its translation (a note on
stderr names each other line), the output is Translator.translate's with the same
constraints (CLI = API, n-best too), and a malformed file, or one of another line count,
is a one-line error before anything is translated, leaving no output file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nmt import Translator
from nmt.generation.terminology import Glossary, read_constraints

BIN = Path(sys.executable).parent
DEMO = Path(__file__).resolve().parents[2] / "data" / "demo"
SEARCH = dict(beam=3, max_len_a=1.0, max_len_b=4)  # the tiny model rarely stops: keep it short
NOTE = re.compile(r"^nmt-generate: note: line (\d+): ")

pytestmark = pytest.mark.usefixtures("one_thread")


def demo(n: int, lang: str = "en") -> list[str]:
    return (DEMO / f"test.{lang}").read_text(encoding="utf-8").splitlines()[:n]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def nmt_generate(
    checkpoint: Path | str, *args: str, search: dict = SEARCH
) -> subprocess.CompletedProcess:
    options = [f"{k}={v}" for k, v in search.items()]
    return subprocess.run(
        [str(BIN / "nmt-generate"), f"checkpoint={checkpoint}", "device=cpu", "threads=1"]
        + options
        + ["progress=false", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def noted_lines(stderr: str) -> list[int]:
    return [int(m.group(1)) for line in stderr.splitlines() if (m := NOTE.match(line))]


def one_line_error(run: subprocess.CompletedProcess, *needles: str) -> str:
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2, run.stderr
    assert len(lines) == 1 and lines[0].startswith("nmt-generate: error: "), run.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def translator(tiny_trained_checkpoint) -> Translator:
    return Translator.from_checkpoint(tiny_trained_checkpoint, device="cpu", **SEARCH)


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    """Eight demo lines and an empty one; per line, phrases from its reference, an exclude,
    none, or more words than the length limit allows; a glossary of two terms."""
    lines = demo(8) + [""]
    refs = demo(8, "de")
    constraints = [
        [refs[0].split()[0]],
        {"include": ["Anna"], "exclude": ["will"]},
        [],
        [refs[3].split()[-2]],
        {"exclude": ["Er", "hat"]},
        [" ".join(refs[4:8])],  # longer than any translation of the line may be
        [refs[6].split()[-2], "rote"],
        [],
        ["Hund"],  # on the empty line
    ]
    return {
        "input": write_lines(tmp_path / "in.en", lines),
        "constraints": write_lines(tmp_path / "c.jsonl", [json.dumps(c) for c in constraints]),
        "glossary": write_lines(
            tmp_path / "g.tsv",
            ["# demo terms", "", "kitchen lamps\tKüchenlampen", "chairs\tStühle"],
        ),
    }


def test_constraints_and_glossary_are_met_or_noted_and_the_cli_is_the_api(
    tiny_trained_checkpoint, translator, files, tmp_path
):
    output = tmp_path / "out.de"
    run = nmt_generate(
        tiny_trained_checkpoint,
        f"input={files['input']}",
        f"constraints={files['constraints']}",
        f"glossary={files['glossary']}",
        f"output={output}",
    )
    assert run.returncode == 0, run.stderr
    written = output.read_text(encoding="utf-8").splitlines()
    texts = files["input"].read_text(encoding="utf-8").splitlines()
    constraints = read_constraints(files["constraints"], len(texts))
    glossary = Glossary.read(files["glossary"])
    best = [
        r[0] for r in translator.translate_batch(texts, constraints=constraints, glossary=glossary)
    ]
    assert written == [t.text for t in best]  # CLI = API
    assert translator.translate(texts, constraints=constraints, glossary=glossary) == written

    unmet = [i + 1 for i, t in enumerate(best) if not t.constraints_met]
    assert noted_lines(run.stderr) == unmet
    assert 6 in unmet and 9 in unmet  # too long for the limit; an empty line
    met_phrases = 0
    for i, (text, wanted) in enumerate(zip(texts, constraints)):
        include = wanted.include + glossary.targets_for(text)
        if best[i].constraints_met:
            assert all(phrase in written[i] for phrase in include), (i, include, written[i])
            met_phrases += len(include)
        for phrase in wanted.exclude:  # banned as pieces: never the phrase's pieces in a row
            pieces = translator.tgt_tokenizer.encode_as_pieces(phrase)
            assert not _contains(best[i].pieces, pieces), (i, phrase, best[i].pieces)
    assert met_phrases >= 5  # of the 7 phrases on the lines 1-8 that can meet theirs
    assert glossary.targets_for(texts[1]) == ("Küchenlampen",)
    assert glossary.targets_for(texts[3]) == ("Stühle",)


def _contains(seq: list[str], part: list[str]) -> bool:
    return any(seq[i : i + len(part)] == part for i in range(len(seq) - len(part) + 1))


def test_nbest_output_lists_the_apis_nbest(tiny_trained_checkpoint, translator, files):
    run = nmt_generate(
        tiny_trained_checkpoint,
        f"input={files['input']}",
        f"constraints={files['constraints']}",
        f"glossary={files['glossary']}",
        "nbest=2",
    )
    assert run.returncode == 0, run.stderr
    texts = files["input"].read_text(encoding="utf-8").splitlines()
    results = translator.translate_batch(
        texts,
        constraints=read_constraints(files["constraints"]),
        glossary=files["glossary"],
        nbest=2,
    )
    expected = [f"{i} ||| {t.text}" for i, per_text in enumerate(results) for t in per_text]
    got = [line.rsplit(" ||| ", 1)[0] for line in run.stdout.splitlines()]
    assert got == expected
    assert got[-1] == f"{len(texts) - 1} ||| "  # the empty line: one empty entry
    for per_text in results:  # those that meet every constraint come first
        met = [t.constraints_met for t in per_text]
        assert met == sorted(met, reverse=True)


def test_a_data_dir_split_takes_a_glossary_on_its_decoded_text(
    tiny_trained_checkpoint, translator, demo_data_dir, tmp_path
):
    glossary = write_lines(tmp_path / "g.tsv", ["chairs\tStühle", "kitchen lamps\tKüchenlampen"])
    greedy = dict(beam=1, max_len_a=0.0, max_len_b=6)  # 500 sentences
    run = nmt_generate(
        tiny_trained_checkpoint,
        f"input={demo_data_dir}",
        "split=test",
        f"glossary={glossary}",
        search=greedy,
    )
    assert run.returncode == 0, run.stderr
    texts = (DEMO / "test.en").read_text(encoding="utf-8").splitlines()
    assert sum(bool(Glossary.read(glossary).targets_for(t)) for t in texts) >= 10
    assert run.stdout.splitlines() == translator.translate(texts, glossary=glossary, **greedy)


# ------------------------------------------------------------------ refused before translating


@pytest.mark.parametrize(
    "constraints, needle",
    [
        ('["Tische"]\n[]\n["Anna", 3]\n', ":3: item 2 is a number (3), not a string"),
        ('["Tische"]\n{"include": [], "must": []}\n[]\n', ':2: unknown key "must"'),
        ('["Tische"]\n[]\n["Anna"\n', ":3: not JSON ("),
        ('["Tische"]\n\n[]\n', ":2: an empty line; write []"),
        ('["Tische"]\n[]\n', ": 2 lines, but input IN has 3; constraints= needs one line"),
        ('["Tische"]\n[]\n[]\n[]\n', ": 4 lines, but input IN has 3"),
    ],
)
def test_a_bad_constraints_file_is_refused_before_the_model_is_loaded(
    tmp_path, nmt_cli, constraints, needle
):
    source = write_lines(tmp_path / "in.en", demo(3))
    path = tmp_path / "c.jsonl"
    path.write_text(constraints, encoding="utf-8")
    output = tmp_path / "out"
    code, out, err = nmt_cli(  # the checkpoint is missing: the file is checked first
        "generate",
        "checkpoint=missing.pt",
        f"input={source}",
        f"constraints={path}",
        f"output={output}",
    )
    run = subprocess.CompletedProcess([], code, out, err)
    one_line_error(run, f"{path}{needle}".replace("IN", str(source)))
    assert not output.exists()


def test_a_bad_glossary_line_is_refused_naming_it(tmp_path, nmt_cli):
    source = write_lines(tmp_path / "in.en", demo(3))
    glossary = write_lines(tmp_path / "g.tsv", ["chairs\tStühle", "lamps Lampen"])
    code, out, err = nmt_cli(
        "generate", "checkpoint=missing.pt", f"input={source}", f"glossary={glossary}"
    )
    assert code == 2 and out == ""
    assert err.strip() == (
        f"nmt-generate: error: {glossary}:2: 0 tabs; write one 'source term<TAB>target term' a line"
    )


def test_phrases_that_cannot_be_met_are_refused_before_translating(
    tiny_trained_checkpoint, tmp_path
):
    source = write_lines(tmp_path / "in.en", demo(3))
    path = write_lines(
        tmp_path / "c.jsonl", ["[]", '{"include": ["rote Tische"], "exclude": ["Tische"]}', "[]"]
    )
    output = tmp_path / "out.de"
    run = nmt_generate(
        tiny_trained_checkpoint, f"input={source}", f"constraints={path}", f"output={output}"
    )
    one_line_error(run, f'{path}:2: include phrase "rote Tische" contains exclude phrase "Tische"')
    assert not output.exists()


def test_a_data_dir_split_needs_one_constraints_line_per_sentence(
    tiny_trained_checkpoint, demo_data_dir, tmp_path
):
    path = write_lines(tmp_path / "c.jsonl", ["[]"] * 3)
    run = nmt_generate(
        tiny_trained_checkpoint, f"input={demo_data_dir}", "split=test", f"constraints={path}"
    )
    one_line_error(run, f"{path}: 3 lines, but input {demo_data_dir} split test has 500")
    assert run.stdout == ""


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["sampling=true"], "constraints="),
        (["ref=REF", "score_reference=true"], "a reference is scored as it is"),
    ],
)
def test_options_that_cannot_take_constraints_are_refused(tmp_path, nmt_cli, extra, needle):
    source = write_lines(tmp_path / "in.en", demo(2))
    path = write_lines(tmp_path / "c.jsonl", ["[]", "[]"])
    extra = [e.replace("REF", str(source)) for e in extra]
    code, _, err = nmt_cli(
        "generate", "checkpoint=missing.pt", f"input={source}", f"constraints={path}", *extra
    )
    assert code == 2 and err.startswith("nmt-generate: error: constraints=") and needle in err
    assert len(err.strip().splitlines()) == 1


def test_a_phrase_with_more_spellings_than_are_banned_is_one_warning(
    tiny_trained_checkpoint, tmp_path
):
    """The library's warning (logged) reaches the user as nmt-generate's own, once."""
    lines = write_lines(tmp_path / "in.en", demo(3))
    word = {"exclude": ["achthundertdreiundvierzig"]}  # a compound: thousands of spellings
    constraints = write_lines(tmp_path / "c.jsonl", [json.dumps(word)] * 3)
    run = nmt_generate(
        tiny_trained_checkpoint, f"input={lines}", f"output={tmp_path / 'out.de'}",
        f"constraints={constraints}",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    warnings = [x for x in run.stderr.splitlines() if "exclude phrase" in x]
    assert len(warnings) == 1, run.stderr
    assert warnings[0].startswith('nmt-generate: warning: exclude phrase "achthundert')
    assert "spellings in target pieces are banned" in warnings[0]
