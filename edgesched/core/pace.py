"""The pace: when free devices get work, and when the server steps (numpy and stdlib only).

Rounds and FedBuff's buffer are two settings of one decision, taken at every look at the fleet:
- `rounds` holds free devices for the next server step, where one round is planned for all of
  them at once, and steps when every job due in the round has ended or at its deadline;
- `stream` gives a free device work the moment it is free and steps once `clients-per-round`
  updates are in (FedBuff's pace: no device idles while there is work to give).
(edgesched.core.policies.edgesched carries both out.)

A pacer chooses the pace for each block of server steps: `FixedPacer` always the same one;
`LearnedPacer` learns which pace trains fastest on this fleet, in the run. It is a bandit over
paces (discounted UCB, Garivier and Moulines 2011): each block of `block_steps` steps is played
at one pace and rewarded with how fast the global loss fell during it, in log loss per second
(the least-squares slope over the block's steps); with `reward = "error"`, how fast the error
rate (one minus the accuracy) fell instead: a model that grows confident on the few users online
can raise the test loss while its accuracy climbs, and the loss would then judge the pace that
made it climb as the worse one (docs/scheduler.md). The loss swings from step to step, so a block
is six steps: a slope over three was mostly noise, and the bandit only took turns. With
`match_spans`, a block also lasts at least as long as the other pace's last six steps took (six
rounds at the scheduler's deadline while rounds are untried). Six streamed steps can take a tenth
of the time of six rounds: judged on a tenth of the span, streaming's slope carried far more
noise, and the exploration spent most of the time on the slower pace (docs/scheduler.md). Spans
are matched only while the fleet loses less than `match_max_loss` of its jobs: where it loses
more, a streamed block as long as six rounds commits a fleet of stale and lost updates to
streaming for much of a run, and the blocks go back to six steps, judged the moment the loss
rate passes the cap. There a block of rounds can be made shorter (`lossy_rounds_steps`): six
rounds last about a minute on a phone fleet, and streaming often reaches the target inside
the opening's block of them (docs/scheduler.md). Old
blocks count less and less (`discount` per block): a pace that led while the model was young must
prove itself again later; the confidence bonus's scale, the rewards' spread, is discounted alike
(see `_spread`). Every choice is returned with its reason for decisions.jsonl. No
randomness: ties go to the earlier pace in the list, so a seed repeats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from edgesched.core.feedback import FLOOR


@dataclass(frozen=True)
class Pace:
    name: str
    hold: bool  # free devices wait for the next step's round


ERROR_FLOOR = 1e-3  # an error rate of 0 counts as this: a perfect step is not an infinite fall
ROUNDS, STREAM = Pace("rounds", hold=True), Pace("stream", hold=False)
PACES = {p.name: p for p in (STREAM, ROUNDS)}  # in the order a learned pace first tries them
REWARDS = ("loss", "error")  # what a learned pace's blocks can be judged by the fall of


class FixedPacer:
    """The same pace for the whole run."""

    def __init__(self, pace: Pace) -> None:
        self.pace = pace
        self._told = False

    def choose(self, step: int, now: float, round_seconds: float = 0.0,
               loss_rate: float = 0.0) -> tuple[Pace, str | None]:
        """The pace of `step`, and why when it was chosen anew (None: unchanged)."""
        why = None if self._told else "fixed pace"
        self._told = True
        return self.pace, why

    def observe(self, step: int, now: float, loss: float, loss_rate: float = 0.0,
                accuracy: float = math.nan) -> None:
        """A fixed pace learns nothing."""


@dataclass(frozen=True)
class BanditConfig:
    block_steps: int = 6  # server steps played at one pace before it is judged
    discount: float = 0.8  # each block, every past block's weight is multiplied by this
    explore: float = 0.5  # width of the confidence bonus, in the rewards' own spread
    match_spans: bool = True  # a block lasts at least as long as the other paces' last block_steps steps
    match_max_loss: float = 0.05  # ... while the fleet's per-job loss rate is below this
    reward: str = "loss"  # what a block is judged by the fall of: the global "loss" or "error" rate
    lossy_rounds_steps: int | None = None  # a block of rounds' steps where losses unmatch spans (None: block_steps)


@dataclass
class _Arm:
    pace: Pace
    weight: float = 0.0  # discounted number of blocks played
    total: float = 0.0  # discounted sum of their rewards
    span: float = 0.0  # virtual seconds its last block's first block_steps steps took (scaled from a shorter block)

    def mean(self) -> float:
        return self.total / self.weight if self.weight > 0 else math.nan

    def unplayed_rounds(self) -> bool:
        """Rounds with no block played yet: their span stands in as block_steps deadlines."""
        return self.pace.hold and self.span == 0


class LearnedPacer:
    """A discounted-UCB bandit over `paces`; see the module docstring."""

    def __init__(self, paces: Sequence[Pace], config: BanditConfig | None = None) -> None:
        if not paces:
            raise ValueError("a learned pace needs at least one pace to choose from")
        self.config = config or BanditConfig()
        self.arms = [_Arm(p) for p in paces]
        self.rewards: list[float] = []  # every block's reward, for the bonus's scale
        self._current = 0
        self._block_left = 0  # steps still to play in this block
        self._block_len = 0  # steps the block was chosen for
        self._playing = False  # a block is under way, not yet judged
        self._block_start = 0.0
        self._round_seconds = 0.0  # how long a round would take, at the last choice
        self._loss_rate = 0.0  # the fleet's per-job loss rate, at the last choice or step
        self._points: list[tuple[float, float]] = []  # (time, log loss): the step before the block, then its own

    @property
    def pace(self) -> Pace:
        return self.arms[self._current].pace

    def choose(self, step: int, now: float, round_seconds: float = 0.0,
               loss_rate: float = 0.0) -> tuple[Pace, str | None]:
        """As FixedPacer's; `round_seconds`, how long a round would take now (the scheduler's
        deadline), stands for the span of block_steps rounds while rounds have not been played;
        `loss_rate`, the share of the fleet's jobs lost, decides whether spans are matched."""
        self._round_seconds = round_seconds
        self._loss_rate = loss_rate
        if self._playing:
            return self.pace, None
        self._current, why = self._pick()
        self._block_len = self._block_left = self._steps_to_play()
        self._playing = True
        self._block_start = now
        span = self._min_span()
        n = self.config.block_steps
        if span > 0 and any(a.unplayed_rounds() for a in self._others()):  # the deadline is learned meanwhile
            why += f"; played for {n} steps and {n} deadlines ({span:.3g} s now)"
        elif span > 0:
            why += f"; played for {n} steps and at least {span:.3g} s"
        elif self._losing_much():
            cap = self.config.match_max_loss
            why += f"; spans not matched while {loss_rate:.0%} of jobs are lost (matched under {cap:.0%})"
            if self._block_len != n:
                why += f"; a block of {self._block_len} rounds"
        self._points = self._points[-1:]  # the block before ended where this one starts
        return self.pace, why

    def _steps_to_play(self) -> int:
        """The block's length in steps: `lossy_rounds_steps` for rounds where spans go unmatched
        for the loss rate, `block_steps` otherwise."""
        if self.pace.hold and self._losing_much() and self.config.lossy_rounds_steps is not None:
            return self.config.lossy_rounds_steps
        return self.config.block_steps

    def _others(self) -> list[_Arm]:
        return [a for i, a in enumerate(self.arms) if i != self._current]

    def _min_span(self) -> float:
        """How long the block being played must last: the other paces' last block_steps steps
        (block_steps deadlines for rounds not yet played)."""
        if not self.config.match_spans or self._losing_much():
            return 0.0
        n = self.config.block_steps
        return max((n * self._round_seconds if a.unplayed_rounds() else a.span for a in self._others()), default=0.0)

    def _losing_much(self) -> bool:
        return self.config.match_spans and self._loss_rate >= self.config.match_max_loss

    def observe(self, step: int, now: float, loss: float, loss_rate: float = 0.0,
                accuracy: float = math.nan) -> None:
        """The global loss and accuracy after `step` (a step of the block being played), and the
        fleet's per-job loss rate then."""
        self._loss_rate = loss_rate
        self._block_left -= 1
        judged, floor = (1.0 - accuracy, ERROR_FLOOR) if self.config.reward == "error" else (loss, FLOOR)
        self._points.append((now, math.log(max(judged, floor)) if math.isfinite(judged) else math.inf))
        if self._block_left == 0:
            self.arms[self._current].span = (now - self._block_start) * (self.config.block_steps / self._block_len)
        if self._block_left <= 0 and now - self._block_start >= self._min_span():
            self._playing = False
            self._reward(fall_rate(self._points))

    def _reward(self, reward: float) -> None:
        if not math.isfinite(reward):  # the loss blew up: the worst block yet, by a spread
            reward = min((r for r in self.rewards), default=0.0) - 2 * _spread(self.rewards)
        for arm in self.arms:
            arm.weight *= self.config.discount
            arm.total *= self.config.discount
        arm = self.arms[self._current]
        arm.weight += 1.0
        arm.total += reward
        self.rewards.append(reward)

    def _pick(self) -> tuple[int, str]:
        untried = [i for i, a in enumerate(self.arms) if a.weight == 0]
        if untried:
            return untried[0], f"trying each pace once: {self.arms[untried[0]].pace.name} not yet played"
        spread = _spread(self.rewards, self.config.discount)
        played = sum(a.weight for a in self.arms)
        scores = [a.mean() + self.config.explore * spread * math.sqrt(2 * math.log(max(played, 1.0)) / a.weight)
                  for a in self.arms]
        best = max(range(len(scores)), key=lambda i: (scores[i], -i))
        board = ", ".join(f"{a.pace.name} {a.mean():.4g}/s over {a.weight:.2f} blocks (bound {s:.4g})"
                          for a, s in zip(self.arms, scores, strict=True))
        return best, f"highest bound on log-{self.config.reward} fall per second: {board}"


def fall_rate(points: Sequence[tuple[float, float]]) -> float:
    """How fast the log loss fell over `points` (time, log loss): minus the least-squares slope,
    per second. A block whose loss went non-finite fell at -inf; one with no time span, 0."""
    if any(not math.isfinite(y) for _, y in points):
        return -math.inf
    if len(points) < 2:
        return 0.0
    n = len(points)
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var <= 0:
        return 0.0
    return -sum((t - mt) * (y - my) for t, y in points) / var


def _spread(rewards: Sequence[float], discount: float = 1.0) -> float:
    """The scale of the confidence bonus: the rewards' standard deviation (their mean size while
    there are too few of them to spread), each weighted as its block is, by `discount` per block
    since: the loss falls ever slower as the model learns, and the spread of the opening's rewards
    would make every late difference look like noise worth exploring."""
    finite = [(discount ** age, r) for age, r in enumerate(reversed(rewards)) if math.isfinite(r)]
    if not finite:
        return 1.0
    total = sum(w for w, _ in finite)
    mean = sum(w * r for w, r in finite) / total
    sd = math.sqrt(sum(w * (r - mean) ** 2 for w, r in finite) / total)
    return sd if sd > 0 else max(abs(mean), 1e-9)
