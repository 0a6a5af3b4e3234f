"""A resumed ``--record`` run records on as the uninterrupted run would (the recorder's
state is in the checkpoint): the same episodes, bit for bit, seeded and replayable."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simkit.cli import main
from simkit.clients.learners._checkpoint import load_checkpoint

RUN = [
    *("simkit/CartPole-v0", "--servers", "0", "--num-envs", "4", "--num-steps", "64"),
    *("--num-minibatches", "2", "--update-epochs", "1", "--no-progress"),
]


def _train(tmp: Path, *extra: str) -> int:
    return main(["train", *RUN, "--logdir", str(tmp), *extra])


def _same_episodes(a: Path, b: Path) -> int:
    """Asserts recordings ``a`` and ``b`` hold the same episodes, bit for bit and in the
    same order; returns how many."""
    from simkit.recording import RecordingReader

    ours, theirs = list(RecordingReader(a)), list(RecordingReader(b))
    assert [(e.seed, len(e.rewards), float(e.rewards.sum())) for e in theirs] == [
        (e.seed, len(e.rewards), float(e.rewards.sum())) for e in ours
    ]
    for x, y in zip(ours, theirs, strict=True):
        assert x.origin == y.origin
        for field in ("obs", "actions", "rewards", "terminated", "truncated", "policy_version"):
            np.testing.assert_array_equal(getattr(x, field), getattr(y, field))
    return len(ours)


@pytest.mark.parametrize("again", [["--record"], []], ids=["record", "no-record"])
def test_a_resumed_recording_goes_on_as_the_uninterrupted_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], again: list[str]
) -> None:
    """A resumed ``--record`` run wrote its episodes unseeded (``replay --verify``
    rejected them) and lost those in flight at the checkpoint; resumed without
    ``--record`` it stopped recording. The recorder's state is in the checkpoint now:
    the recording equals the uninterrupted run's, with or without the flag."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert _train(whole, "--total-steps", "768", "--record", str(whole / "rec")) == 0
    assert _train(cut, "--total-steps", "256", "--record", str(cut / "rec")) == 0
    saved = load_checkpoint(cut).state.get("recorder")
    capsys.readouterr()
    resume = ["train", "simkit/CartPole-v0", "--resume", str(cut), "--total-steps", "768"]
    assert main([*resume, "--no-progress", *again, *([str(cut / "rec")] if again else [])]) == 0
    err = capsys.readouterr().err
    kept = f"simkit train: --resume: the checkpoint's run recorded into {cut / 'rec'}: "
    assert (kept in err) is not again
    assert _same_episodes(whole / "rec", cut / "rec") > 10
    assert main(["replay", str(cut / "rec"), "--verify"]) == 0, capsys.readouterr().out
    assert any(s["steps"]["length"] for s in saved["slots"])  # episodes open at the cut


def test_resuming_a_checkpoint_without_recorder_state_into_a_recording_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simkit.recording import RecordingReader

    run, rec = tmp_path / "run", tmp_path / "rec"
    assert _train(run, "--total-steps", "256") == 0
    capsys.readouterr()
    resume = ["train", "simkit/CartPole-v0", "--resume", str(run), "--total-steps", "512"]
    assert main([*resume, "--no-progress", "--record", str(rec)]) == 0
    assert (
        "simkit train: --record: the checkpoint holds no recorder state (written before it "
        "was kept, or by a run without --record): the episodes in flight are not recorded, "
        "and each env records from its next episode on, unseeded (replay --verify cannot "
        "re-simulate those)\n"
    ) in capsys.readouterr().err
    assert len(RecordingReader(rec)) > 0


def test_episodes_written_past_the_checkpoint_are_not_written_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run that went on past its checkpoint (killed, or resumed from an older one) had
    written the episodes that ended since: the resumed run does not write them again."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert _train(whole, "--total-steps", "768", "--record", str(whole / "rec")) == 0
    every = ("--checkpoint-every", "1")
    assert _train(cut, "--total-steps", "768", "--record", str(cut / "rec"), *every) == 0
    capsys.readouterr()
    older = cut / "checkpoints" / "update-00000002"
    resume = ["train", "simkit/CartPole-v0", "--resume", str(older), "--total-steps", "768"]
    assert main([*resume, "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "episode(s) the interrupted run wrote after its checkpoint: the resumed run " in err
    assert _same_episodes(whole / "rec", cut / "rec") > 10


def test_open_episodes_of_dict_and_tuple_spaces_round_trip_through_a_snapshot() -> None:
    from simkit import snapshot
    from simkit.recording._fragments import _Rows, _rows_from, _rows_state, _stack

    rows = _Rows()
    for t in range(3):
        rows.obs.append({"a": np.full(2, t, np.float32), "b": (np.int64(t), np.zeros((1, 2)))})
        rows.actions.append((np.array(t % 2), np.full(3, 0.5 * t)))
        rows.rewards.append(float(t))
        rows.terminated.append(False)
        rows.truncated.append(t == 2)
        rows.versions.append(t)
    back = _rows_from(snapshot.loads(snapshot.dumps(_rows_state(rows))))
    assert back is not None
    assert (back.rewards, back.terminated, back.truncated, back.versions) == (
        rows.rewards,
        rows.terminated,
        rows.truncated,
        rows.versions,
    )
    for column in ("obs", "actions"):
        ours, theirs = _stack(getattr(rows, column)), _stack(getattr(back, column))
        assert type(ours) is type(theirs)
        np.testing.assert_equal(ours, theirs)
    assert isinstance(back.obs[0]["b"], tuple)
    assert _rows_from(snapshot.loads(snapshot.dumps(_rows_state(_Rows())))) is not None
    assert _rows_state(None) is None


@pytest.mark.parametrize("gone", ["removed", "not a recording"])
def test_a_resume_records_on_only_into_a_recording(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], gone: str
) -> None:
    """Without ``--record``, a resumed run recorded on into whatever directory its
    checkpoint named, creating it or writing beside other files. It records on only into
    a recording (a writer's lock or chunks are there); otherwise it says so and records
    nothing."""
    import shutil

    cut = tmp_path / "cut"
    rec = cut / "rec"
    assert _train(cut, "--total-steps", "256", "--record", str(rec)) == 0
    shutil.rmtree(rec)
    if gone == "not a recording":
        rec.mkdir()
        (rec / "notes.txt").write_text("mine")
    capsys.readouterr()
    resume = ["train", "simkit/CartPole-v0", "--resume", str(cut), "--total-steps", "512"]
    assert main([*resume, "--no-progress"]) == 0
    assert (
        f"simkit train: --resume: the checkpoint's run recorded into {rec}, which holds no "
        "recording now: the resumed run records nothing (give --record DIR to record)\n"
    ) in capsys.readouterr().err
    if gone == "removed":
        assert not rec.exists()
    else:
        assert [p.name for p in rec.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("format", np.array([1, 1])), ("root_seed", np.array([7, 7])), ("format", True)],
)
def test_a_recorder_state_whose_tags_are_arrays_is_refused_naming_them(
    tmp_path: Path, field: str, value: object
) -> None:
    """A checkpoint's recorder state holding an array as its format or root seed raised
    numpy's "truth value of an array ... is ambiguous", naming nothing."""
    from simkit.recording._fragments import FragmentRecorder

    recorder = FragmentRecorder(tmp_path / "rec", "simkit/CartPole-v0", root_seed=7)
    try:
        state = {**recorder.get_state(), field: value}
        with pytest.raises(ValueError, match=field.replace("_", " ")):
            recorder.set_state(state)
    finally:
        recorder.close()
