"""The pace: rounds and streaming on the engine, and a pace learned in the run (no Flower, no torch)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from edgesched.config import RunConfig
from edgesched.core import policies
from edgesched.core.decisions import Arrived, Paced, Released
from edgesched.core.fleet import DeviceView
from edgesched.core.pace import PACES, BanditConfig, LearnedPacer, Pace, fall_rate
from edgesched.core.predict import Predictor
from edgesched.core.risk import DropoutModel
from edgesched.errors import ConfigError

from .fakes import Fleet, ScriptedTransport, StepClock, run
from .heartbeats import heartbeat

PLAIN = BanditConfig(match_spans=False)  # blocks of six steps, however long they take


def edgesched(k: int, pace: str, **over) -> policies.EdgeschedPolicy:
    cfg = RunConfig.from_mapping({"clients": k, "fraction-train": 1.0, "round-timeout": 600.0,
                                  "strategy": "edgesched", "pace": pace, **over})
    return policies.edgesched(cfg, Predictor(4 * 10_000, {"pi": 0.001}))


def sends(transport: ScriptedTransport) -> list[tuple[float, str]]:
    return [(s.at, s.device) for s in transport.sent]


def test_streaming_gives_a_free_device_work_at_once_and_steps_per_k_updates():
    # d0 and d1 are four times as fast as d2 and d3: streaming steps as soon as k = 2 updates are
    # in, and sends the fast two again at once while the slow ones still train (each after its
    # step: held while its update waits, as stream-hold "always" holds it).
    seconds = {"d0": 1.0, "d1": 1.0, "d2": 4.0, "d3": 4.0}
    streamed = ScriptedTransport(StepClock(), seconds)
    _, records = run(edgesched(2, "stream", **{"stream-hold": "always"}), streamed, Fleet(4), steps=3)
    assert [(r.replied, r.virtual_seconds) for r, _ in records] == [(2, 1.0), (2, 2.0), (2, 3.0)]
    assert [t for t, d in sends(streamed) if d == "d0"] == [0.0, 1.0, 2.0]  # each time it is back
    assert [t for t, d in sends(streamed) if d == "d2"] == [0.0]


def test_streaming_holds_a_device_whose_update_waits_for_the_step():
    # k = 2 and d0 is back before anyone else: it waits for the step instead of filling it alone.
    seconds = {"d0": 1.0, "d1": 4.0, "d2": 4.0}
    transport = ScriptedTransport(StepClock(), seconds)
    _, records = run(edgesched(2, "stream", **{"min-deadline": 10.0}), transport, Fleet(3), steps=1)
    assert [t for t, d in sends(transport) if d == "d0"] == [0.0]
    assert (records[0][0].replied, records[0][0].virtual_seconds) == (3, 4.0)


def test_without_the_hold_a_device_whose_update_waits_is_sent_again_at_once():
    # As above, with stream-hold "never" (FedBuff's way): d0 goes again at 1 s and its second
    # update completes the step at 2 s, before the slow devices are back.
    seconds = {"d0": 1.0, "d1": 4.0, "d2": 4.0}
    transport = ScriptedTransport(StepClock(), seconds)
    policy = edgesched(2, "stream", **{"min-deadline": 10.0, "stream-hold": "never"})
    _, records = run(policy, transport, Fleet(3), steps=1)
    assert (records[0][0].replied, records[0][0].virtual_seconds) == (2, 2.0)
    assert [t for t, d in sends(transport) if d == "d0" and t < 2.0] == [0.0, 1.0]


def priced_run(lost_before: int, k: int = 2, delivered_before: int = 0,
               max_loss: float = 1.0) -> tuple[policies.EdgeschedPolicy, list, ScriptedTransport]:
    """The fleet above (and a d3 as slow, for k = 3) with the hold priced while the fleet loses
    under `max_loss` of its jobs, after `delivered_before` jobs delivered and `lost_before` lost
    at 0 s on other devices that have not come back (so a loss reads as costly: they are all
    still away)."""
    cfg = RunConfig.from_mapping({"clients": k, "fraction-train": 1.0, "round-timeout": 600.0, "min-deadline": 10.0,
                                  "strategy": "edgesched", "pace": "stream", "stream-hold": "priced",
                                  "priced-max-loss": max_loss})
    risk = DropoutModel()
    for i in range(delivered_before):
        risk.note_job(f"done{i}", lost=False, now=0.0)
    for i in range(lost_before):
        risk.note_job(f"gone{i}", lost=True, now=0.0)
    policy = policies.edgesched(cfg, Predictor(4 * 10_000, {"pi": 0.001}), risk)
    transport = ScriptedTransport(StepClock(), {"d0": 1.0, "d1": 4.0, "d2": 4.0, "d3": 4.0})
    _, records = run(policy, transport, Fleet(k + 1), steps=1)
    return policy, records, transport


def test_a_priced_hold_sends_a_waiting_device_again_while_losses_cost_nothing():
    # Nothing lost yet: holding d0 from 1 s to the step at 4 s idles it, sending it risks nothing.
    policy, records, transport = priced_run(lost_before=0)
    assert (records[0][0].replied, records[0][0].virtual_seconds) == (2, 2.0)
    assert [t for t, d in sends(transport) if d == "d0" and t < 2.0] == [0.0, 1.0]
    released = [d for d in policy.log if isinstance(d, Released)]
    assert (released[0].t, released[0].device, released[0].absence_s) == (1.0, "d0", 0.0)
    assert released[0].wait_s == 0.0  # d1's and d2's jobs were predicted back at once (a Pi's prior speed)
    assert {r.device for r in released} == {"d0"}


def test_a_priced_hold_sends_a_waiting_device_again_at_most_once_a_step():
    # k = 3: d0's second update is in at 2 s, and with two waiting it is held until the step at
    # 4 s (its two updates and the three slow ones, back together).
    policy, records, transport = priced_run(lost_before=0, k=3)
    assert [t for t, d in sends(transport) if d == "d0" and t < 4.0] == [0.0, 1.0]
    assert (records[0][0].replied, records[0][0].virtual_seconds) == (5, 4.0)
    assert [(r.t, r.device) for r in policy.log if isinstance(r, Released) and r.t < 4.0] == [(1.0, "d0")]


def test_a_priced_hold_keeps_a_waiting_device_once_a_loss_keeps_devices_away():
    # Twenty jobs lost at 0 s, none back: at 1 s a loss reads as 20 s away at a risk near 0.8,
    # more than d0 would idle (the step reads as due), so it is held as with stream-hold "always".
    policy, records, transport = priced_run(lost_before=20)
    assert (records[0][0].replied, records[0][0].virtual_seconds) == (3, 4.0)
    assert [t for t, d in sends(transport) if d == "d0"] == [0.0]
    assert not [d for d in policy.log if isinstance(d, Released)]


def test_a_priced_hold_prices_only_while_the_fleet_loses_few_jobs():
    # The default cap, 5 %: before any job has ended the risk model's prior reads 10 % of jobs
    # lost, and d0 is held as with stream-hold "always"; after twenty delivered (2 %) it is sent
    # again at 1 s, as above.
    default_cap = RunConfig().scheduler.priced_max_loss
    policy, _, transport = priced_run(lost_before=0, max_loss=default_cap)
    assert [t for t, d in sends(transport) if d == "d0"] == [0.0]
    assert not [d for d in policy.log if isinstance(d, Released)]
    policy, _, transport = priced_run(lost_before=0, delivered_before=20, max_loss=default_cap)
    assert [t for t, d in sends(transport) if d == "d0" and t < 2.0] == [0.0, 1.0]
    assert [(r.t, r.device) for r in policy.log if isinstance(r, Released)][:1] == [(1.0, "d0")]


def test_early_step_needs_the_hold():
    for hold in ("never", "priced"):
        with pytest.raises(ConfigError, match=r"early-step.*needs stream-hold = always"):
            edgesched(2, "stream", **{"early-step": True, "stream-hold": hold})
    with pytest.raises(ConfigError, match=r"stream-hold.*must be one of always, priced, never"):
        edgesched(2, "stream", **{"stream-hold": "sometimes"})


def test_streaming_keeps_at_most_k_times_overselect_jobs_in_flight():
    transport = ScriptedTransport(StepClock(), {f"d{i}": 2.0 for i in range(10)})
    run(edgesched(2, "stream", **{"max-overselect": 1.5}), transport, Fleet(10), steps=1)
    at_start = [d for t, d in sends(transport) if t == 0.0]
    assert len(at_start) == 3  # ceil(2 x 1.5)


def test_streaming_steps_with_fewer_updates_when_the_fleet_cannot_supply_k():
    # k = 4 with four devices online, two of which never reply, planned on a prior far below the
    # others' 5 s: once two deadlines have passed, the step is taken with half of k in.
    transport = ScriptedTransport(StepClock(), {"d0": 5.0, "d1": 5.0})
    _, records = run(edgesched(4, "stream"), transport, Fleet(10, online=4), steps=1)
    assert (records[0][0].replied, records[0][0].virtual_seconds) == (2, 5.0)
    # Only one of them replies: it never brings half of k, so the step waits for the round timeout.
    transport = ScriptedTransport(StepClock(), {"d0": 5.0})
    _, records = run(edgesched(4, "stream"), transport, Fleet(10, online=4), steps=1)
    assert (records[0][0].replied, records[0][0].virtual_seconds) == (1, 600.0)
    # One device online: a step never waits for more updates than there are devices to send them.
    transport = ScriptedTransport(StepClock(), {"d0": 5.0})
    _, records = run(edgesched(4, "stream", **{"min-deadline": 10.0}), transport, Fleet(10, online=1), steps=1)
    assert (records[0][0].replied, records[0][0].virtual_seconds) == (1, 5.0)


class FlatBatteries(Fleet):
    """d2 and d3 are online with their batteries below the reserve: they can take no work."""

    def views(self, now: float) -> list[DeviceView]:
        flat = heartbeat("d", battery_percent=5.0, charging=False)
        return [DeviceView(v.device, v.samples, replace(flat, device_id=v.device) if v.device in ("d2", "d3")
                           else None) for v in super().views(now)]


def test_streaming_steps_at_once_when_no_update_is_still_coming():
    # k = 4 of four online devices, but two cannot work: once the two jobs out are in, nothing else
    # can come, and holding their devices for a step nobody can fill would idle them.
    transport = ScriptedTransport(StepClock(), {f"d{i}": 5.0 for i in range(4)})
    policy = edgesched(4, "stream", **{"min-deadline": 10.0})
    _, records = run(policy, transport, FlatBatteries(4), steps=2)
    assert [(r.replied, r.virtual_seconds) for r, _ in records] == [(2, 5.0), (2, 10.0)]
    assert sorted({s.device for s in transport.sent}) == ["d0", "d1"]


class TwoBoards(Fleet):
    """d0 and d1 are fast boards, d2 and d3 slow ones, and the predictor's priors know it."""

    def views(self, now: float) -> list[DeviceView]:
        return [DeviceView(v.device, v.samples, board="fast" if v.device in ("d0", "d1") else "slow")
                for v in super().views(now)]


def test_an_early_step_frees_held_devices_when_the_next_update_is_far_off():
    # k = 4: d0 and d1 are back at 1 s, d2 and d3 at 12 s. Held for a full step, the fast two idle
    # for 11 s; with early-step the step is taken on their two updates (half of k) once each of them
    # could do a whole job before a slow one is due, and they are sent again at once.
    def first_step(early: bool) -> tuple[tuple[int, float], list[float]]:
        transport = ScriptedTransport(StepClock(), {"d0": 1.0, "d1": 1.0, "d2": 12.0, "d3": 12.0})
        cfg = RunConfig.from_mapping({"clients": 4, "fraction-train": 1.0, "round-timeout": 600.0,
                                      "strategy": "edgesched", "pace": "stream", "min-deadline": 20.0,
                                      "stream-hold": "always", "early-step": early})
        policy = policies.edgesched(cfg, Predictor(4 * 10_000, {"fast": 1 / 60, "slow": 12 / 60}))
        _, records = run(policy, transport, TwoBoards(4), steps=2)
        return (records[0][0].replied, records[0][0].virtual_seconds), [t for t, d in sends(transport) if d == "d0"]

    assert first_step(early=False) == ((4, 12.0), [0.0, 12.0])
    step, d0_sent = first_step(early=True)
    assert step == (2, 1.0) and d0_sent[:2] == [0.0, 1.0]


def test_with_paced_staleness_a_streamed_bound_is_counted_at_the_pace_steps_come():
    # k = 2, four in flight: were every job a deadline long, two steps a deadline. The fast boards
    # d0 and d1 bring a step every second while the slow d2's job takes 6 s, about a deadline:
    # counted at two steps a deadline its update would be too stale; at the pace the steps come,
    # every one of its jobs after the first counts.
    transport = ScriptedTransport(StepClock(), {"d0": 1.0, "d1": 1.0, "d2": 6.0})
    cfg = RunConfig.from_mapping({"clients": 2, "fraction-train": 1.0, "round-timeout": 600.0,
                                  "strategy": "edgesched", "pace": "stream", "stream-hold": "never",
                                  "paced-staleness": True})
    policy = policies.edgesched(cfg, Predictor(4 * 10_000, {"fast": 1 / 60, "slow": 6 / 60}))
    run(policy, transport, TwoBoards(3), steps=30)
    slow = [(d.outcome, d.staleness, d.staleness_bound) for d in policy.log
            if isinstance(d, Arrived) and d.device == "d2"]
    assert len(slow) >= 4
    assert slow[0][0] == "too_stale" and slow[0][2] == 2  # planned before any streamed step was measured
    assert all(outcome == "counted" and bound > 2 for outcome, _, bound in slow[1:])


def test_a_fixed_pace_is_logged_once():
    policy = edgesched(2, "stream")
    run(policy, ScriptedTransport(StepClock(), {"d0": 1.0, "d1": 1.0}), Fleet(2), steps=3)
    paced = [d for d in policy.log if isinstance(d, Paced)]
    assert [(p.round, p.pace, p.reason) for p in paced] == [(1, "stream", "fixed pace")]


def test_the_fall_rate_is_the_slope_of_log_loss_and_a_blow_up_is_the_worst():
    points = [(t, math.log(2.0) - 0.1 * t) for t in (0.0, 1.0, 2.0, 5.0)]
    assert fall_rate(points) == pytest.approx(0.1)
    assert fall_rate([(0.0, 1.0), (1.0, math.inf)]) == -math.inf
    assert fall_rate([(3.0, 1.0)]) == 0.0


def play(pacer: LearnedPacer, rate: dict[str, float], steps: int, noise: float = 0.0, seed: int = 0) -> list[str]:
    """Drive a pacer on a made-up world where each pace makes log-loss fall at its own rate per
    second, a step taking one second; the paces played, step by step."""
    rng = np.random.default_rng(seed)
    log_loss, played = 0.0, []
    for step in range(1, steps + 1):
        pace, _ = pacer.choose(step, float(step - 1))
        played.append(pace.name)
        log_loss -= rate[pace.name] + noise * rng.normal()
        pacer.observe(step, float(step), math.exp(log_loss))
    return played


def test_the_learned_pace_tries_each_then_mostly_plays_the_fastest():
    paces = list(PACES.values())
    rate = {"rounds": 0.01, "stream": 0.03}
    played = play(LearnedPacer(paces, replace(PLAIN, block_steps=3)), rate, steps=90,
                  noise=0.005)
    assert played[:6] == ["stream"] * 3 + ["rounds"] * 3  # each once, in order
    assert played[6:].count("stream") > 0.7 * len(played[6:])
    rate = {"rounds": 0.03, "stream": 0.01}  # and the other way round
    played = play(LearnedPacer(paces, replace(PLAIN, block_steps=3)), rate, steps=90,
                  noise=0.005)
    assert played[6:].count("rounds") > 0.7 * len(played[6:])


def test_the_learned_pace_follows_a_fleet_that_changes():
    # Rounds are best for the first 60 steps, then streaming: discounting lets it switch.
    pacer = LearnedPacer([PACES["rounds"], PACES["stream"]], replace(PLAIN, block_steps=3))
    first = play(pacer, {"rounds": 0.03, "stream": 0.01}, steps=60)
    later = play(pacer, {"rounds": 0.01, "stream": 0.03}, steps=60)
    assert first[30:].count("rounds") > 20 and later[30:].count("stream") > 20


def test_exploration_shrinks_with_the_rewards_as_the_model_learns():
    # The opening's loss falls ten times faster than the later loss. Late on, streaming makes the
    # loss rise; the bonus is scaled by the recent blocks' spread, not the opening's, so streaming
    # is tried again only now and then: here in under a tenth of the last 120 steps (with the
    # opening's spread, over a third).
    pacer = LearnedPacer([PACES["stream"], PACES["rounds"]], BanditConfig(match_spans=False))
    log_loss, played = 0.0, []
    for step in range(1, 301):
        pace, _ = pacer.choose(step, float(step - 1))
        log_loss -= {"rounds": 0.3, "stream": 0.1}[pace.name] if step <= 60 else \
            {"rounds": 0.01, "stream": -0.01}[pace.name]
        pacer.observe(step, float(step), math.exp(log_loss))
        played.append(pace.name)
    assert played[180:].count("stream") < 12


def test_the_learned_pace_repeats_and_says_why():
    paces = list(PACES.values())
    rate = {"rounds": 0.01, "stream": 0.03}
    runs = [play(LearnedPacer(paces, PLAIN), rate, steps=40, noise=0.01, seed=3) for _ in range(2)]
    assert runs[0] == runs[1]
    pacer = LearnedPacer(paces, PLAIN)
    play(pacer, rate, steps=12)
    _, why = pacer.choose(13, 12.0)
    assert why is not None and "highest bound" in why and "stream" in why and "rounds" in why


def test_a_pace_that_blows_the_loss_up_is_scored_worst():
    paces = [Pace("calm", hold=False), Pace("wild", hold=True)]
    pacer = LearnedPacer(paces, replace(PLAIN, block_steps=1))
    pacer.choose(1, 0.0)
    pacer.observe(1, 1.0, 0.5)
    pacer.choose(2, 1.0)
    pacer.observe(2, 2.0, math.nan)
    assert pacer.arms[1].mean() < pacer.arms[0].mean()
    assert pacer.choose(3, 2.0)[0].name == "calm"


def test_judged_by_the_error_rate_a_pace_that_raises_the_loss_while_accuracy_climbs_wins():
    # Streaming makes the model confident on the users online: the test loss rises 2 % a second
    # while the error rate falls 3 %; rounds hold both level. By the loss rounds win, by the error
    # rate streaming, and the reason names what was judged.
    def played(reward: str) -> tuple[list[str], str]:
        pacer = LearnedPacer(list(PACES.values()), replace(PLAIN, block_steps=3, reward=reward))
        log_loss, log_error, names = 0.0, math.log(0.3), []
        for step in range(1, 61):
            pace, _ = pacer.choose(step, float(step - 1))
            names.append(pace.name)
            if pace.name == "stream":
                log_loss, log_error = log_loss + 0.02, log_error - 0.03
            pacer.observe(step, float(step), math.exp(log_loss), accuracy=1 - math.exp(log_error))
        why = pacer.choose(61, 60.0)[1] or ""
        return names[6:], why

    by_loss, why_loss = played("loss")
    by_error, why_error = played("error")
    assert by_loss.count("rounds") > 0.7 * len(by_loss) and by_error.count("stream") > 0.7 * len(by_error)
    assert "log-loss fall" in why_loss and "log-error fall" in why_error


@pytest.mark.parametrize("reward", ["loss", "error"])
def test_the_engine_shows_the_learned_pace_the_steps_accuracy(reward):
    # The loss stays at 1 while the accuracy climbs 1 point a step: judged by the error rate the
    # first block fell, judged by the loss it stood still.
    scores = iter((1.0, 0.5 + 0.01 * i) for i in range(100))
    policy = edgesched(2, "learned", **{"pace-reward": reward, "matched-spans": False})
    run(policy, ScriptedTransport(StepClock(), {"d0": 1.0, "d1": 1.0}), Fleet(2), steps=6,
        evaluate=lambda w: next(scores))
    first = policy.pacer.arms[0]
    assert isinstance(policy.pacer, LearnedPacer) and first.weight == 1.0
    assert (first.mean() > 0) == (reward == "error") and first.mean() >= 0


def test_a_perfect_step_is_a_finite_fall_of_the_error_rate():
    pacer = LearnedPacer([PACES["stream"]], replace(PLAIN, block_steps=2, reward="error"))
    pacer.choose(1, 0.0)
    pacer.observe(1, 1.0, 0.4, accuracy=0.9)
    pacer.observe(2, 2.0, 0.1, accuracy=1.0)
    assert pacer.arms[0].mean() == pytest.approx(math.log(0.1 / 1e-3))  # from 10 % to 0.1 % in a second, not to 0


def play_timed(pacer: LearnedPacer, rate: dict[str, float], seconds: dict[str, float], until: float,
               noise: float, seed: int = 0) -> list[str]:
    """As `play`, but a step of each pace takes its own virtual seconds, until `until`, and each
    step's loss carries the same noise whatever its length (short steps: a noisy slope)."""
    rng = np.random.default_rng(seed)
    now, trend, played = 0.0, 0.0, []
    while now < until:
        pace, _ = pacer.choose(len(played) + 1, now)
        played.append(pace.name)
        now += seconds[pace.name]
        trend -= rate[pace.name] * seconds[pace.name]
        pacer.observe(len(played), now, math.exp(trend + noise * rng.normal()))
    return played


def test_a_block_of_quick_steps_lasts_as_long_as_the_slow_paces_block():
    pacer = LearnedPacer(list(PACES.values()), BanditConfig(block_steps=3, match_spans=True))
    played = play_timed(pacer, {"stream": 0.01, "rounds": 0.01}, {"stream": 1.0, "rounds": 10.0}, until=63.0,
                        noise=0.0)
    # stream 3 x 1 s (nothing to match yet), rounds 3 x 10 s, then stream until it spans 30 s
    assert played == ["stream"] * 3 + ["rounds"] * 3 + ["stream"] * 30
    # a pace is matched to the other's first block_steps steps, not its whole block: no ratchet
    assert {a.pace.name: a.span for a in pacer.arms} == {"stream": 3.0, "rounds": 30.0}
    _, why = pacer.choose(37, 63.0)
    assert why is not None and "at least 30 s" in why
    unmatched = LearnedPacer(list(PACES.values()), replace(PLAIN, block_steps=3))
    play_timed(unmatched, {"stream": 0.01, "rounds": 0.01}, {"stream": 1.0, "rounds": 10.0}, until=33.0, noise=0.0)
    _, why = unmatched.choose(7, 33.0)  # six steps played in two blocks: a new block
    assert why is not None and "at least" not in why


def test_spans_are_matched_only_while_the_fleet_loses_little():
    pacer = LearnedPacer(list(PACES.values()), BanditConfig(block_steps=3, match_spans=True, match_max_loss=0.2))
    seconds = {"stream": 1.0, "rounds": 10.0}
    played, now, reasons, loss_rate = [], 0.0, [], 0.1
    while now < 50.0:
        loss_rate = 0.3 if now >= 45.0 else 0.1  # from 45 s on, the fleet loses 30 % of its jobs
        pace, why = pacer.choose(len(played) + 1, now, loss_rate=loss_rate)
        played.append(pace.name)
        reasons += [why] if why else []
        now += seconds[pace.name]
        pacer.observe(len(played), now, math.exp(-0.01 * now), loss_rate=loss_rate)
    # stream 3 x 1 s, rounds 3 x 10 s, then a stream block matched to 30 s while 10 % are lost:
    # it ends at the first step once 30 % are, at 46 s, not at 63 s
    assert played[:19] == ["stream"] * 3 + ["rounds"] * 3 + ["stream"] * 13
    unmatched = "; spans not matched while 30% of jobs are lost (matched under 20%)"
    assert "at least 30 s" in reasons[2] and reasons[3].endswith(unmatched)
    assert len(set(played[19:22])) == 1 and reasons[4].endswith(unmatched)  # 3 steps


def test_where_the_fleet_loses_much_a_block_of_rounds_can_be_shorter():
    def opening(loss_rate: float, **over) -> tuple[list[str], list[str], float]:
        pacer = LearnedPacer(list(PACES.values()), BanditConfig(match_max_loss=0.05, **over))
        seconds = {"stream": 2.0, "rounds": 10.0}
        played, now, reasons = [], 0.0, []
        while len(played) < 12:
            pace, why = pacer.choose(len(played) + 1, now, round_seconds=10.0, loss_rate=loss_rate)
            played.append(pace.name)
            reasons += [why] if why else []
            now += seconds[pace.name]
            pacer.observe(len(played), now, math.exp(-0.01 * now), loss_rate=loss_rate)
        return played, reasons, pacer.arms[1].span

    played, reasons, span = opening(0.1, lossy_rounds_steps=3)
    assert played[:9] == ["stream"] * 6 + ["rounds"] * 3  # the opening's rounds: 30 s, not 60
    assert reasons[1].endswith("; a block of 3 rounds")
    assert span == 60.0  # recorded as six rounds' worth, what a matched block is measured against
    played, reasons, _ = opening(0.1)  # the default: six, as for streaming
    assert played[:12] == ["stream"] * 6 + ["rounds"] * 6 and "a block of" not in reasons[1]
    played, _, _ = opening(0.0, lossy_rounds_steps=3)  # losing nothing: spans matched, rounds in sixes
    assert played.count("rounds") in (0, 6)


def test_matched_spans_give_a_faster_pace_of_quicker_noisier_steps_most_of_the_time():
    # Streaming makes the loss fall three times as fast per second, in steps ten times as short,
    # each step's loss as noisy as a round's. Judged over six quick steps, streaming has most of
    # the blocks but little of the time, and an unlucky block shuts it out for long.
    rate, seconds = {"stream": 0.03, "rounds": 0.01}, {"stream": 0.5, "rounds": 5.0}
    share = {}
    for match in (False, True):
        streamed = []
        for seed in range(6):
            played = play_timed(LearnedPacer(list(PACES.values()), BanditConfig(match_spans=match)), rate, seconds,
                                until=1000.0, noise=0.05, seed=seed)
            streamed.append(played.count("stream") * seconds["stream"] / sum(seconds[p] for p in played))
        share[match] = float(np.mean(streamed))
    assert share[False] < 0.5 < 0.75 < share[True], share


def test_before_rounds_are_played_the_first_block_lasts_as_long_as_six_rounds_would():
    pacer = LearnedPacer(list(PACES.values()), BanditConfig(match_spans=True))  # stream first, then rounds
    played, now, reasons = [], 0.0, []
    while now < 30.0:  # steps of one second; a round would take 4 s
        pace, why = pacer.choose(len(played) + 1, now, round_seconds=4.0)
        played.append(pace.name)
        reasons += [why] if why else []
        now += 1.0
        pacer.observe(len(played), now, math.exp(-0.01 * now))
    assert played == ["stream"] * 24 + ["rounds"] * 6
    assert reasons[0].endswith("played for 6 steps and 6 deadlines (24 s now)")
    assert reasons[1].endswith("played for 6 steps and at least 6 s")  # stream's first six steps
