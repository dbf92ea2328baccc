"""An estimate scaled from runs of another shape says so (issue 39: "94 s projected, 32 s taken", from
2-epoch runs scaled to 6 epochs with no word): the dry run's estimate and submit's makespan line."""

from __future__ import annotations

from orchestrator.scheduling.estimates import epoch_rates, estimate_s, estimate_source, scaled_from

HISTORY = [("configs/a.yaml", "classify", 2, 30.0), ("configs/a.yaml", "classify", 2, 34.0),
           ("configs/b.yaml", "recon", 6, 60.0)]


def test_the_same_shape_is_plain_history() -> None:
    rates = epoch_rates(HISTORY)
    assert estimate_source(config="configs/a.yaml", task="classify", epochs=2, est_min=None,
                           rates=rates) == "history of 2 runs"
    assert scaled_from(config="configs/a.yaml", task="classify", epochs=2, est_min=None, rates=rates) == ""


def test_other_epochs_are_scaled_and_say_so() -> None:
    rates = epoch_rates(HISTORY)
    assert estimate_s(config="configs/a.yaml", task="classify", epochs=6, history=rates) == 96.0  # 16 s/epoch x 6
    assert estimate_source(config="configs/a.yaml", task="classify", epochs=6, est_min=None, rates=rates) == (
        "history of 2 runs, from 2-epoch runs, scaled to 6 epochs")


def test_another_configs_runs_are_scaled_and_say_so() -> None:
    rates = epoch_rates(HISTORY)
    assert estimate_source(config="configs/c.yaml", task="recon", epochs=6, est_min=None, rates=rates) == (
        "history of 1 runs, from other configs' runs of recon, scaled to 6 epochs")
    assert scaled_from(config="configs/c.yaml", task="recon", epochs=6, est_min=1.0, rates=rates) == ""  # est_min=


def test_submits_makespan_line_says_how_many_estimates_were_scaled() -> None:
    from orchestrator.api.submitting import SubmitResult
    from orchestrator.cli.render import _makespan

    result = SubmitResult("q1", "q.txt", [], None, {"c1": "local", "c2": "local"}, [], False,  # type: ignore[arg-type]
                          makespan_s=94.0, makespan_known=True, makespan_scaled=1)
    assert _makespan(result) == ("projected makespan 94 s (1 of 2 estimates scaled from runs of another shape; "
                                 "`gpuq submit --dry-run` says which)")
    result.makespan_scaled = 0
    assert _makespan(result) == "projected makespan 94 s"
