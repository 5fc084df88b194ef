"""DDP on CPU with gloo: 2 ranks equal 1 rank with update_freq=2; a dead rank is an error.

Each test starts real processes (torchrun, or two ranks by hand), so each takes some
seconds; both are bounded by subprocess timeouts and never hang.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import (
    NO_DROPOUT,
    assert_bitwise_equal,
    last_params,
    outputs_of,
    rank_env,
    rendezvous_store,
    run_training,
    tiny_config,
    torchrun_standalone,
)

from nmt.checkpoint import load_checkpoint
from nmt.distributed import DistEnv, env_from_environ
from nmt.model.transformer import Transformer
from nmt.training import build_training
from nmt.training.data import load_train_data

# build_training(threads=1) sets torch's global thread count; the fixture restores it after each test.
pytestmark = pytest.mark.usefixtures("one_thread")


def _events(save_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (save_dir / "train.jsonl").read_text().splitlines()]


def two_ranks_and_one(demo_data_dir: Path, tmp_path: Path, common: dict) -> tuple[dict, dict]:
    """The tiny model (no dropout) trained on `demo_data_dir` (or another data dir) with
    `common` by 2 gloo ranks (update_freq=1, in tmp_path/ddp) and by one process
    (update_freq=2, in tmp_path/single): their last weights, which must be the same updates."""
    worker = tmp_path / "worker.py"
    worker.write_text(
        textwrap.dedent(f"""
        from pathlib import Path
        from helpers import NO_DROPOUT, tiny_config, train_as_a_rank
        train_as_a_rank(tiny_config(Path({str(demo_data_dir)!r}), Path({str(tmp_path / "ddp")!r}),
                                 update_freq=1, model=NO_DROPOUT, **{common!r}))
    """)
    )
    failure = torchrun_standalone([str(worker)], tmp_path / "logs", timeout=300)
    assert failure is None, failure
    run_training(
        tiny_config(demo_data_dir, tmp_path / "single", update_freq=2, model=NO_DROPOUT, **common)
    )
    return last_params(tmp_path / "ddp"), last_params(tmp_path / "single")


def test_env_from_environ():
    assert env_from_environ({}) == DistEnv(0, 1, 0)
    env = env_from_environ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert env.rank == 3 and env.local_rank == 1 and env.is_distributed and not env.is_main


def test_two_gloo_ranks_equal_one_rank_with_update_freq_2(demo_data_dir, tmp_path):
    # 14 updates of 2 batches cross the end of the first epoch; an odd batch count there
    # gives rank 1 a weight-0 dummy pass, which must not change the update either. The final
    # validation (loss and BLEU, each rank on its share) must equal the single process's.
    common = dict(
        max_update=14,
        optim={"clip_norm": 0.5},
        validation={"split": "test", "bleu": {"enabled": True, "max_sentences": 12, "len_b": 4}},
    )
    ddp, single = two_ranks_and_one(demo_data_dir, tmp_path, common)
    # Bitwise, on any CPU: each rank computes its batch's gradients as the single process
    # does (the same operations on the same shapes), and two ranks' all-reduce adds two
    # numbers (a + b == b + a exactly) as the accumulation does; DDP's division by the world
    # size and nmt's loss weight world_size / tokens are powers of two apart, exact in fp32.
    assert_bitwise_equal(ddp, single)
    valid = [
        [e for e in _events(tmp_path / run) if e["type"] == "valid"][-1]
        for run in ("ddp", "single")
    ]
    # the same fp32 batch losses, summed in float64 in another association: gamma(n, 2**-53)
    assert valid[0]["loss"] == pytest.approx(valid[1]["loss"], rel=1e-12, abs=0)
    assert valid[0]["ntokens"] == valid[1]["ntokens"] and valid[0]["bleu"] == pytest.approx(
        valid[1]["bleu"]
    )
    # and training moved the weights: the comparison is not between two initialisations
    init = build_training(
        tiny_config(demo_data_dir, tmp_path / "fresh", model=NO_DROPOUT)
    ).model.state_dict()
    assert max(float((init[k] - single[k]).abs().max()) for k in init) > 1e-3


def test_multilingual_two_ranks_equal_one_rank(multilingual_data_dir, tmp_path):
    """Tags, temperature draws and per-direction validation split over ranks as a single
    pair's batches are: the updates and every direction's valid figures are the same."""
    common = dict(
        train_split="train",
        lang_tag="src_tgt",
        sampling_temperature=3.0,
        max_update=8,
        validation={"split": "valid", "bleu": {"enabled": True, "max_sentences": 6, "len_b": 4}},
    )
    ddp, single = two_ranks_and_one(multilingual_data_dir, tmp_path, common)
    assert_bitwise_equal(ddp, single)
    valid = [
        [e for e in _events(tmp_path / run) if e["type"] == "valid"][-1]
        for run in ("ddp", "single")
    ]
    assert list(valid[0]["directions"]) == list(valid[1]["directions"]) and valid[0]["directions"]
    for d, figures in valid[0]["directions"].items():
        other = valid[1]["directions"][d]
        assert figures["loss"] == pytest.approx(other["loss"], rel=1e-12, abs=0)
        assert figures["bleu"] == pytest.approx(other["bleu"])


def test_target_side_subword_sampling_two_ranks_equal_one_rank(demo_data_dir, tmp_path):
    """Sampled targets change the update's token count, which no rank knows alone: the
    ranks agree on it in the update's host all-reduce and rescale their gradients, so that
    2 ranks still make the updates of 1 rank with update_freq=2 (the same draws: they are
    a function of seed, epoch and batch, not of the rank)."""
    common = dict(max_update=6, subword={"src_alpha": 0.2, "tgt_alpha": 0.2})
    ddp, single = two_ranks_and_one(demo_data_dir, tmp_path, common)
    # bitwise, for the reasons of the test above: the agreed token count is one integer
    assert_bitwise_equal(ddp, single)
    # the logged token counts are those drawn, longer than those stored
    logged = [
        sum(e["tokens"] for e in _events(tmp_path / run) if e["type"] == "train")
        for run in ("ddp", "single")
    ]
    data = load_train_data(tiny_config(demo_data_dir, tmp_path / "probe", **common))
    stored = sum(int(data.train.tgt_sizes[rows].sum()) for rows in data.epoch_batches(1)[:12])
    assert logged[0] == logged[1] > stored


def test_an_out_of_memory_batch_on_one_rank_is_skipped_by_every_rank(
    demo_data_dir, tmp_path, monkeypatch
):
    """Rank 1 runs out of memory in update 3 (an injected allocation failure in its
    forward): it still joins the gradient all-reduce, both ranks skip update 3 and go on,
    and the run equals one process with update_freq=2 whose update 3 ran out of memory."""
    common = dict(max_update=6, optim={"clip_norm": 0.5})
    worker = tmp_path / "worker.py"
    worker.write_text(
        textwrap.dedent(f"""
        import os
        import torch
        from pathlib import Path
        from helpers import NO_DROPOUT, tiny_config, train_as_a_rank
        from nmt.model.transformer import Transformer

        if os.environ["RANK"] == "1":
            real_forward, calls = Transformer.forward, []
            def forward(self, *args, **kwargs):
                calls.append(1)
                if len(calls) == 3:  # update 3: one micro-batch per update
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9 GiB")
                return real_forward(self, *args, **kwargs)
            Transformer.forward = forward
        train_as_a_rank(tiny_config(Path({str(demo_data_dir)!r}), Path({str(tmp_path / "ddp")!r}),
                                 update_freq=1, model=NO_DROPOUT, **{common!r}))
    """)
    )
    failure = torchrun_standalone([str(worker)], tmp_path / "logs", timeout=300)
    assert failure is None, failure
    real_forward, calls = Transformer.forward, []

    def forward(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 6:  # update 3's second batch: the one rank 1 ran
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9 GiB")
        return real_forward(self, *args, **kwargs)

    monkeypatch.setattr(Transformer, "forward", forward)
    run_training(
        tiny_config(demo_data_dir, tmp_path / "single", update_freq=2, model=NO_DROPOUT, **common)
    )
    ooms = {
        run: [
            (e["update"], e["skipped_total"]) for e in _events(tmp_path / run) if e["type"] == "oom"
        ]
        for run in ("ddp", "single")
    }
    assert ooms == {"ddp": [(3, 1)], "single": [(3, 1)]}
    assert [e["ranks"] for e in _events(tmp_path / "ddp") if e["type"] == "oom"] == [1]
    # bitwise, as in test_two_gloo_ranks_equal_one_rank_with_update_freq_2
    assert_bitwise_equal(last_params(tmp_path / "ddp"), last_params(tmp_path / "single"))
    states = [
        load_checkpoint(tmp_path / run / "checkpoint_last.pt")["train_state"]
        for run in ("ddp", "single")
    ]
    # 6 updates made and 1 skipped: the same batches consumed in both runs
    assert states[0]["num_updates"] == states[1]["num_updates"] == 6
    assert (states[0]["epoch"], states[0]["position"]) == (
        states[1]["epoch"],
        states[1]["position"],
    )


def test_resuming_with_more_ranks_gives_the_new_rank_a_dropout_stream_of_its_own(
    demo_data_dir, tmp_path
):
    """A run saved by one process and resumed by 2 ranks: rank 0 continues the saved
    stream, rank 1 (which has no saved state) must not copy it, or the two ranks would draw
    the same dropout masks for the rest of the run."""
    save_dir = tmp_path / "run"
    run_training(tiny_config(demo_data_dir, save_dir, max_update=2))  # dropout 0.1
    saved = load_checkpoint(save_dir / "checkpoint_last.pt")["train_state"]["rng"]
    assert len(saved) == 1
    worker = tmp_path / "worker.py"
    worker.write_text(
        textwrap.dedent(f"""
        import json, os
        import torch
        from pathlib import Path
        from helpers import tiny_config, train_as_a_rank
        from nmt.training import loop

        real_run = loop.run
        def run(t):  # the first draws of this rank's stream, as the run starts
            state = torch.get_rng_state()
            draws = torch.rand(8).tolist()
            torch.set_rng_state(state)
            Path({str(tmp_path)!r}, f"draws{{os.environ['RANK']}}.json").write_text(
                json.dumps(draws))
            return real_run(t)
        loop.run = run
        train_as_a_rank(tiny_config(Path({str(demo_data_dir)!r}), Path({str(save_dir)!r}),
                                 max_update=4))
    """)
    )
    failure = torchrun_standalone([str(worker)], tmp_path / "logs", timeout=300)
    assert failure is None, failure
    draws = [json.loads((tmp_path / f"draws{r}.json").read_text()) for r in (0, 1)]
    saved_stream = torch.Generator()  # (the test process's own generators stay untouched)
    saved_stream.set_state(saved[0]["torch"])
    assert draws[0] == torch.rand(8, generator=saved_stream).tolist()  # rank 0: continued
    assert draws[1] != draws[0]
    assert load_checkpoint(save_dir / "checkpoint_last.pt")["train_state"]["num_updates"] == 4


def start_ranks_with_a_faulty_rank_1(
    demo_data_dir: Path, tmp_path: Path, port: int, fault: str, imports: str = ""
) -> list[subprocess.Popen]:
    """Start 2 gloo ranks of a tiny nmt-train meeting at the rendezvous_store on `port`;
    rank 1 runs `fault` when its 3rd update starts.

    `fault` is one statement (it may use `os`); `imports` adds import lines to the worker.
    """
    worker = tmp_path / "worker.py"
    worker.write_text(
        textwrap.dedent(f"""
        import os
        from nmt.cli import main
        from nmt.training import step
        {imports}

        if os.environ["RANK"] == "1":
            real_step = step.train_step
            def faulty_step(t, group):
                if t.progress.num_updates == 2:
                    {fault}
                real_step(t, group)
            step.train_step = faulty_step
        main("train", ["data={demo_data_dir}", "save_dir={tmp_path / "run"}", "train_split=valid",
                       "validation.split=''", "max_tokens=500", "max_update=50", "threads=1", "device=cpu",
                       "distributed.timeout=20", "logging.tensorboard=false", "logging.progress_bar=false",
                       "model.embed_dim=16", "model.ffn_dim=32", "model.encoder_layers=1",
                       "model.decoder_layers=1", "model.attention_heads=2"])
    """)
    )
    return [
        subprocess.Popen(
            [sys.executable, str(worker)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=rank_env(port, r),
        )
        for r in range(2)
    ]


TEARDOWN_MARK = "interpreter teardown ran"


def test_a_dead_rank_makes_the_other_exit_with_a_clear_error(demo_data_dir, tmp_path):
    """Rank 1 dies with os._exit: a crash with no cleanup and no goodbye. Rank 0 prints
    one line and exits 2, and it leaves without the interpreter's teardown (its atexit
    hook never runs): in that teardown gloo's threads, left by the dead peer, could call
    std::terminate and turn exit 2 into SIGABRT (docs/journal/2026-11-26-reliability-diary.md, 12b)."""
    mark = f"import atexit, sys; atexit.register(print, {TEARDOWN_MARK!r}, file=sys.stderr)"
    with rendezvous_store() as port:
        procs = start_ranks_with_a_faulty_rank_1(
            demo_data_dir, tmp_path, port, "os._exit(3)", imports=mark
        )
        outs = outputs_of(procs, timeout=120)
    assert procs[1].returncode == 3
    assert procs[0].returncode == 2, outs[0][1][-2000:]
    last = outs[0][1].strip().splitlines()[-1]
    assert last.startswith("nmt-train: error: rank 0/2: lost contact with the other ranks"), last
    assert TEARDOWN_MARK not in outs[0][1]
