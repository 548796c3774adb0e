"""Running one drawn :class:`~contract.pipelines.Case` of the resume contract and checking its invariant.

The invariant: a run resumed from a checkpoint yields exactly what the uninterrupted run yields after
that checkpoint (the rest of the epoch, then the next epoch), or ``state_dict()`` / ``load_state_dict()``
/ iteration raises a typed :class:`pipekit.errors.PipekitError` naming the cause, within
:data:`BOUND_S` seconds; never a hang, never an item missing, duplicated or empty.

Both runs follow a training loop that seeds the DataLoader's ``generator=`` at the start of each epoch
(``generator.manual_seed(seed + epoch)``), or only once, when the loader is made (``Case.reseed=False``: the
epochs after the resumed one then come only from what the checkpoint kept of the generator), and keeps torch's
RNG state with the loader's in its checkpoints
(pipes draw the seeds of later passes, a ``shuffle`` under ``cycle``, from it); the resumed epoch itself
gets another generator seed, so its order can come only from the checkpoint.
"""

from __future__ import annotations

import io
import logging
import pickle
import signal
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from contract.pipelines import (
    Case,
    Corpus,
    change_file,
    copy_corpus,
    corrupt_jpeg,
    has_empty_bytes,
    make_loader,
    plain,
    strings_in,
    victim_of,
)
from pipekit.errors import PipekitError

BOUND_S = 30.0  # each run (uninterrupted, checkpointed, resumed) must end, or raise, within this


class Hang(BaseException):
    """Raised in the main thread by the watchdog: a run took longer than :data:`BOUND_S`."""


class ContractBrokenError(AssertionError):
    pass


def _on_watchdog(signum: int, frame: Any) -> None:
    raise Hang("no item and no error within the bound")


@contextmanager
def watchdog(what: str, limit: float | None = None) -> Iterator[None]:
    """Raise :class:`Hang` in this (main) thread if the block runs longer than ``limit`` (:data:`BOUND_S`) seconds.

    SIGUSR1 sent to the main thread by a timer: pytest-timeout keeps SIGALRM for the test as a whole.
    """
    limit = BOUND_S if limit is None else limit
    previous = signal.signal(signal.SIGUSR1, _on_watchdog)
    timer = threading.Timer(limit, signal.pthread_kill, (threading.main_thread().ident, signal.SIGUSR1))
    timer.daemon = True
    timer.start()
    try:
        yield
    except Hang as exc:
        raise ContractBrokenError(f"{what}: hung: {exc} ({limit:g} s)") from None
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)


@dataclass
class Outcome:
    """An epoch as a user sees it: the batches (as plain values), then the error that ended it, if any."""

    items: list[Any] = field(default_factory=list)
    error: BaseException | None = None

    def key(self) -> tuple[list[Any], str | None]:
        return self.items, None if self.error is None else type(self.error).__name__


def drain(it: Any, out: Outcome | None = None) -> Outcome:
    out = Outcome() if out is None else out
    try:
        for batch in it:
            out.items.append(plain(batch))
    except Exception as exc:
        out.error = exc
    return out


@dataclass
class Notices:
    """Warnings and pipekit log records seen in this process while a block ran."""

    messages: list[str] = field(default_factory=list)

    def names(self, name: str) -> bool:
        return any(name in m for m in self.messages)


class _Collect(logging.Handler):
    def __init__(self, notices: Notices) -> None:
        super().__init__(logging.WARNING)
        self.notices = notices

    def emit(self, record: logging.LogRecord) -> None:
        self.notices.messages.append(record.getMessage())


@contextmanager
def notices() -> Iterator[Notices]:
    seen = Notices()
    handler = _Collect(seen)
    logger = logging.getLogger("pipekit")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield seen
    finally:
        logger.removeHandler(handler)
    seen.messages += [str(w.message) for w in caught]


def roundtrip(state: Any, via: str) -> Any:
    if via == "torch_save":
        buf = io.BytesIO()
        torch.save(state, buf)
        buf.seek(0)
        return torch.load(buf, weights_only=True)
    return pickle.loads(pickle.dumps(state))


def cause_words(case: Case, corpus: Corpus) -> tuple[str, ...]:
    """What a typed error (or, for a changed file, a warning) must name for this case's fault."""
    if case.fault == "lock":
        return ("lock",)
    if case.fault == "generator":
        return ("generator",)
    if case.fault in ("delete", "replace", "read_error"):
        if case.fault == "read_error" and case.source != "imagefolder":
            return ("missing",)
        return (victim_of(case, corpus).name,)
    return ()


def check_error(exc: BaseException, where: str, case: Case, corpus: Corpus) -> None:
    """A refusal must be a typed pipekit error naming the cause."""
    if not isinstance(exc, PipekitError):
        raise ContractBrokenError(f"{where}: untyped {type(exc).__module__}.{type(exc).__name__}: {exc}"[:800]) from exc
    words = cause_words(case, corpus)
    if words and not any(w.lower() in str(exc).lower() for w in words):
        raise ContractBrokenError(f"{where}: {type(exc).__name__} does not name {words}: {exc}"[:800]) from exc


@dataclass
class Reference:
    epochs: list[Outcome]
    skips: int


def reference_run(case: Case, corpus: Corpus) -> Reference:
    """Two uninterrupted epochs (the second only when the first ended without an error)."""
    torch.manual_seed(case.seed)
    generator = torch.Generator()
    generator.manual_seed(case.seed)
    loader = make_loader(case, corpus, generator)
    epochs: list[Outcome] = []
    try:
        with watchdog("uninterrupted run"):
            for epoch in range(2):
                if case.reseed:
                    generator.manual_seed(case.seed + epoch)
                epochs.append(drain(loader))
                if epochs[-1].error is not None:
                    break
            skips = loader.skip_report().count
    finally:
        loader.shutdown()
    for outcome in epochs:
        if outcome.error is not None:
            check_error(outcome.error, "uninterrupted run", case, corpus)
    return Reference(epochs, skips)


def checkpoint_after(case: Case, batches: int) -> int | None:
    """How many batches the checkpointed run takes before its checkpoint (None: iter() is not called)."""
    if case.point == "before":
        return None
    if case.point == "after_iter" or batches == 0:
        return 0
    if case.point in ("last", "end") or batches == 1:
        return batches
    return min(batches - 1, max(1, round(case.fraction * batches)))  # strictly inside the epoch


def run_case(case: Case, corpus: Corpus, scratch: Any) -> None:
    """Check the contract for ``case``; raises :class:`ContractBrokenError` naming what broke."""
    if case.fault in ("delete", "replace") or (case.fault == "read_error" and case.source == "imagefolder"):
        corpus = copy_corpus(corpus, scratch)
    if case.fault == "read_error" and case.source == "imagefolder":
        corrupt_jpeg(victim_of(case, corpus))
    ref = reference_run(case, corpus)
    first = ref.epochs[0]
    read_all = not any(op[0] == "header" for op in case.ops)
    if case.fault == "read_error" and case.on_error == "skip" and read_all and ref.skips == 0 and first.error is None:
        raise ContractBrokenError("on_error='skip': the unreadable file was not counted in skip_report()")
    ended = first.error is None and case.point == "end"
    take = checkpoint_after(case, len(first.items))

    # the checkpointed run
    torch.manual_seed(case.seed)
    generator = torch.Generator()
    generator.manual_seed(case.seed)
    loader = make_loader(case, corpus, generator)
    head = Outcome()
    try:
        with watchdog("checkpointed run"):
            if take is not None:
                it = iter(loader)
                if ended:
                    drain(it, head)
                else:
                    for _ in range(take):
                        try:
                            head.items.append(plain(next(it)))
                        except StopIteration:
                            raise ContractBrokenError(f"the checkpointed run ended after {len(head.items)} batches, "
                                                 f"the uninterrupted one gave {len(first.items)}") from None
                        except Exception as exc:
                            check_error(exc, "checkpointed run", case, corpus)
                            raise ContractBrokenError(f"the checkpointed run failed where the uninterrupted one "
                                                 f"did not: {exc!r:.300}") from exc
            try:
                # a training checkpoint holds torch's RNG state too: pipes draw later epochs' seeds from it
                state = {"loader": loader.state_dict(), "rng": torch.get_rng_state()}
            except Exception as exc:
                check_error(exc, "state_dict()", case, corpus)
                return
            try:
                state = roundtrip(state, case.via)
            except Exception as exc:
                raise ContractBrokenError(f"the checkpoint does not survive {case.via}: {exc!r:.300}") from exc
    finally:
        loader.shutdown()
    if case.fault in ("delete", "replace"):
        change_file(case, corpus)

    # the resumed run
    torch.manual_seed(case.seed + 1000)
    generator = torch.Generator()
    generator.manual_seed(case.seed)  # a new process makes its loader as the first one did
    loader = make_loader(case, corpus, generator)
    resumed: list[Outcome] = []
    try:
        with notices() as seen, watchdog("resumed run"):
            try:
                torch.set_rng_state(state["rng"])
                loader.load_state_dict(state["loader"])
            except Exception as exc:
                check_error(exc, "load_state_dict()", case, corpus)
                return
            epochs = [1] if ended else [0, 1]
            for epoch in epochs:
                # a resumed epoch's order comes from the checkpoint; a fresh epoch's from the loop's seed
                fresh = epoch == 1 or case.point == "before"
                if case.reseed:
                    generator.manual_seed(case.seed + epoch if fresh else 987654321)
                resumed.append(drain(loader))
                if resumed[-1].error is not None or case.fault in ("delete", "replace"):
                    break
            skipped = [s.url for s in loader.skip_report().skipped]
    finally:
        loader.shutdown()
    for outcome in resumed:
        if outcome.error is not None:
            check_error(outcome.error, "resumed run", case, corpus)

    if case.fault in ("delete", "replace"):
        check_changed_data(case, corpus, first, head, resumed[0], seen, skipped)
        return
    if ended:
        compare(resumed[0], ref.epochs[1], "the epoch after an end-of-epoch checkpoint")
        return
    rest = Outcome(head.items + resumed[0].items, resumed[0].error)
    compare(rest, first, f"the epoch resumed after {take} batches")
    if len(resumed) > 1 and len(ref.epochs) > 1:
        compare(resumed[1], ref.epochs[1], "the epoch after the resumed one")


def compare(got: Outcome, expected: Outcome, what: str) -> None:
    if got.key() == expected.key():
        return
    g, e = got.items, expected.items
    at = next((i for i, (a, b) in enumerate(zip(g, e)) if a != b), min(len(g), len(e)))
    raise ContractBrokenError(
        f"{what}: {len(g)} batches (error {got.key()[1]}) instead of {len(e)} (error {expected.key()[1]}); "
        f"first difference at batch {at}: got {g[at] if at < len(g) else 'nothing'!r:.300}, "
        f"expected {e[at] if at < len(e) else 'nothing'!r:.300}"
        + (f"; error: {got.error!r:.300}" if got.error is not None else "")
    )


def check_changed_data(case: Case, corpus: Corpus, first: Outcome, head: Outcome, rest: Outcome,
                       seen: Notices, skipped: list[str]) -> None:
    """A file changed between checkpoint and resume: exact, or refused, or re-planned and said so.

    Without an error or a warning (or skip) naming the file, a replaced file not yet opened at the
    checkpoint may be read with its new contents (the same items by name), and a checkpoint taken before
    the first item resumes as the uninterrupted run's epoch over the files as they are now; anything else
    must be exact.
    A refusal (a typed error naming the file: ``run_case`` checked that) may come after items of the
    resumed run, which must not repeat any item nor be empty.
    """
    if head.items + rest.items == first.items and rest.error is None:
        return  # the change did not touch what was left to read
    name = victim_of(case, corpus).name
    root = str(corpus.root)
    got = Counter(s for b in head.items + rest.items for s in strings_in(b) if root in s)
    want = Counter(s for b in first.items for s in strings_in(b) if root in s)
    said = seen.names(name) or any(name in url for url in skipped)
    opened = any(name in s for b in head.items for s in strings_in(b))
    what = f"{case.fault} of {name} between checkpoint and resume"
    if rest.error is not None:  # refused, naming the file
        for ident in set(got):
            if got[ident] > want[ident]:
                raise ContractBrokenError(f"{what}, refused: {ident} duplicated before the refusal")
        if any(has_empty_bytes(b) for b in rest.items):
            raise ContractBrokenError(f"{what}, refused: an item before the refusal is empty (b'')")
        return
    if not head.items and not said:
        # nothing was read at the checkpoint: the resumed epoch must be a fresh epoch over the files as they are
        # now (with the checkpoint's seeds, which are the uninterrupted run's)
        compare(rest, reference_run(case, corpus).epochs[0], f"{what}, checkpoint before the first item")
        return
    if not said:
        if case.fault == "replace" and not opened and rest.error is None:
            if got == want:
                return  # read afresh: its new contents, under the same names
            # a pipe routing by content (demux, filter) may route the new contents otherwise: then the whole
            # epoch must be the uninterrupted run's over the files as they are now; with 2 workers, in an order
            # of its own (a worker whose share now yields more, or less, takes its turns where the checkpoint
            # left the loader's round robin, not where a fresh epoch's would), but every batch exactly once
            fresh = reference_run(case, corpus).epochs[0]
            if head.items + rest.items == fresh.items and fresh.error is None:
                return
            if case.num_workers > 1 and fresh.error is None and _same_batches(head.items + rest.items, fresh.items):
                return
        raise ContractBrokenError(
            f"{what}: the resumed epoch differs from the uninterrupted one"
            f"{' (the file was being read at the checkpoint)' if opened else ''} and no error, warning or skip "
            f"names the file ({len(head.items)} + {len(rest.items)} batches instead of {len(first.items)})"
        )
    for ident in set(got) | set(want):
        if name in ident:
            if got[ident] > want[ident]:
                raise ContractBrokenError(f"{what}, re-planned: {ident} duplicated")
        elif got[ident] != want[ident]:
            raise ContractBrokenError(f"{what}, re-planned: {ident} {got[ident]}x, expected {want[ident]}x")
    if any(has_empty_bytes(b) for b in rest.items):
        raise ContractBrokenError(f"{what}, re-planned: an item is empty (b'')")


def _same_batches(got: list[Any], expected: list[Any]) -> bool:
    return Counter(map(repr, got)) == Counter(map(repr, expected))


def timed_run(case: Case, corpus: Corpus, scratch: Any) -> float:
    start = time.monotonic()
    run_case(case, corpus, scratch)
    return time.monotonic() - start
