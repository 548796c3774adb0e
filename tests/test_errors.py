"""Stage errors name the file and stage; SkipLog counts what was skipped."""

from __future__ import annotations

import csv
import json
import logging
import lzma
import pickle
import zlib

import pytest

import pipekit
import pipekit.errors
from pipekit.errors import (
    ArchiveError,
    ConfigurationError,
    CorruptStreamError,
    CSVParseError,
    DecodeError,
    HashError,
    JSONParseError,
    ParseError,
    ReadError,
    SkipLog,
    SkipReport,
    StageError,
    TruncatedStreamError,
    UnknownFormatError,
    UnsupportedItemError,
    WorkerDiedError,
    check_on_error,
)
from pipekit.pipes import IterableWrapper


class TestStageErrors:
    def test_message_names_url_and_stage(self):
        err = DecodeError("decode image", "s3://b/x.jpg", "decode_image", "not a JPEG")
        assert str(err) == "cannot decode image 's3://b/x.jpg' in decode_image: not a JPEG"
        assert (err.url, err.stage, err.reason) == ("s3://b/x.jpg", "decode_image", "not a JPEG")
        assert isinstance(err, ValueError)
        assert isinstance(ReadError("open", "a", "s", "r"), OSError)

    def test_reason_from_an_exception(self):
        err = ArchiveError("read", "a.tar", "load_from_tar", EOFError("truncated"))
        assert err.reason == "truncated"

    def test_pickles_with_fields(self):
        err = pickle.loads(pickle.dumps(ReadError("open", "/x", "open_files_by_fsspec", "missing")))
        assert isinstance(err, ReadError)
        assert str(err) == "cannot open '/x' in open_files_by_fsspec: missing"


SECRET_URLS = [
    ("s3://AKIAEXAMPLE:wJalrXUtnFEMIsecret@bucket/x.jpg", "wJalrXUtnFEMIsecret"),
    ("https://alice:hunter2pass@data.example.com/shards/0.tar", "hunter2pass"),
    ("https://b.s3.amazonaws.com/x.tar?X-Amz-Algorithm=AWS4&X-Amz-Signature=deadbeef0123&X-Amz-Expires=60",
     "deadbeef0123"),
    ("https://acct.blob.core.windows.net/c/x.tar?sv=2021&sig=c2VjcmV0c2ln%3D&se=2030", "c2VjcmV0c2ln"),
    ("https://example.com/x.jpg?token=tok_abcdef123&size=2", "tok_abcdef123"),
    ("https://ghp_tokenasusername123@github.com/o/r/archive.tar", "ghp_tokenasusername123"),
]


class TestSecretsInURLs:
    """An error naming a URL with credentials or a signed query prints it without the secret (issue 35)."""

    @pytest.mark.parametrize(("url", "secret"), SECRET_URLS)
    def test_stage_error_message_repr_and_pickle(self, url, secret):
        err = ReadError("open", url, "open_files_by_fsspec", f"failed reading {url}")
        again = pickle.loads(pickle.dumps(err))
        for shown in (str(err), repr(err), str(again), repr(again)):
            assert secret not in shown
        assert "open_files_by_fsspec" in str(err) and "***" in str(err)

    def test_the_url_stays_recognisable(self):
        err = ReadError("open", SECRET_URLS[0][0], "open_files_by_fsspec", "missing")
        assert "s3://AKIAEXAMPLE:***@bucket/x.jpg" in str(err)
        err = ReadError("open", SECRET_URLS[2][0], "open_files_by_fsspec", "missing")
        assert "X-Amz-Signature=***&X-Amz-Expires=60" in str(err)

    @pytest.mark.parametrize(("url", "secret"), SECRET_URLS[:3])
    def test_other_pipekit_errors_and_skip_reports(self, url, secret, caplog):
        for err in (WorkerDiedError(f"worker 0 died reading {url}", 0, url=url),
                    ConfigurationError(f"nothing to read under {url}")):
            assert secret not in str(err) and secret not in repr(err)
        log = SkipLog("open_files_by_fsspec")
        with caplog.at_level(logging.WARNING, logger="pipekit"):
            log.record(ReadError("open", url, "open_files_by_fsspec", f"no such file {url}"))
        report = SkipReport.from_summaries([log.summary()])
        assert secret not in caplog.text and secret not in str(report) and secret not in repr(report.skipped)

    def test_a_failed_open_names_the_file_without_its_token(self, tmp_path):
        url = (tmp_path / "missing.bin").as_uri() + "?token=tok_abcdef123"
        pipe = IterableWrapper([url]).open_files_by_fsspec(mode="rb")
        with pytest.raises(ReadError) as info:
            list(pipe)
        assert "missing.bin" in str(info.value) and "tok_abcdef123" not in str(info.value)

    @pytest.mark.parametrize("url", ["memory://AKIAEXAMPLE:wJalrXUtnFEMIsecret@bucket/missing.bin",
                                     "memory://bucket/missing.bin?X-Amz-Signature=wJalrXUtnFEMIsecret"])
    def test_a_cause_repeating_the_path_without_its_scheme_is_redacted(self, url):
        """The memory filesystem strips the scheme: its ``FileNotFoundError`` said
        ``/AKIAEXAMPLE:wJalrXUtnFEMIsecret@bucket/missing.bin``, which no URL pattern recognises."""
        with pytest.raises(ReadError) as info:
            list(IterableWrapper([url]).open_files_by_fsspec(mode="rb"))
        err = info.value
        again = pickle.loads(pickle.dumps(err))
        for shown in (str(err), repr(err), err.reason, str(again), repr(again), again.reason):
            assert "wJalrXUtnFEMIsecret" not in shown, shown
        assert "missing.bin" in str(err) and "open_files_by_fsspec" in str(err)


def _fail_on_three(x: int) -> int:
    if x == 3:
        raise DecodeError("decode image", f"s3://bucket/it's {x}.jpg", "decode_image", "not a JPEG\nsecond line")
    return x


def _fail_chained(x: int) -> int:
    try:
        raise OSError("connection reset")
    except OSError as exc:
        raise ReadError("read", "s3://b/k.tar", "load_from_tar", exc) from exc


class TestAcrossWorkers:
    """torch re-raises a worker's error as ``type(message)``: the type and its fields must survive."""

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_type_and_fields_survive(self, num_workers):
        pipe = IterableWrapper(range(8)).sharding_filter().map(_fail_on_three)
        with pytest.raises(DecodeError) as info:
            list(pipekit.DataLoader(pipe, num_workers=num_workers))
        err = info.value
        assert isinstance(err, ValueError)
        assert err.url == "s3://bucket/it's 3.jpg"
        assert err.stage == "decode_image"
        assert err.action == "decode image"
        assert err.reason == "not a JPEG\nsecond line"

    def test_chained_cause_is_not_mistaken_for_the_error(self):
        with pytest.raises(ReadError) as info:
            list(pipekit.DataLoader(IterableWrapper([1, 2]).sharding_filter().map(_fail_chained), num_workers=2))
        assert (info.value.url, info.value.stage, info.value.reason) == (
            "s3://b/k.tar",
            "load_from_tar",
            "connection reset",
        )
        assert isinstance(info.value, OSError)

    def test_rebuilt_from_a_worker_message(self):
        message = (
            "Caught ParseError in DataLoader worker process 1.\nOriginal Traceback (most recent call last):\n"
            '  File "x.py", line 1, in f\n'
            "pipekit.errors.ParseError: cannot parse JSON 'a.json' in parse_json_files: Expecting value\n"
        )
        err = ParseError(message)
        assert (err.url, err.stage, err.action, err.reason) == (
            "a.json",
            "parse_json_files",
            "parse JSON",
            "Expecting value",
        )
        assert str(err) == message
        assert HashError(message).url == "<unknown>"  # another type's message: fields unknown, message kept


def _bad_json(x: int) -> int:
    raise JSONParseError("parse JSON", f"s3://b/{x}.json", "parse_json_files", "line 1 column 2: bad", doc="[", pos=1)


class TestTorchdataTypes:
    """Each error that replaces one torchdata let through is also of that built-in type."""

    @pytest.mark.parametrize(
        ("cls", "builtins"),
        [
            (JSONParseError, (json.JSONDecodeError, ParseError, ValueError)),
            (CSVParseError, (csv.Error, ParseError, ValueError)),
            (UnknownFormatError, (RuntimeError, ArchiveError)),
            (CorruptStreamError, (OSError, lzma.LZMAError, zlib.error, ArchiveError)),
            (TruncatedStreamError, (EOFError, ArchiveError)),
        ],
    )
    def test_stage_errors_are_also_the_builtin_type(self, cls, builtins):
        err = cls("act", "s3://b/k", "stage", "why")
        assert isinstance(err, builtins)
        assert str(err) == "cannot act 's3://b/k' in stage: why"
        clone = pickle.loads(pickle.dumps(err))
        assert type(clone) is cls
        assert (clone.url, clone.stage, clone.reason) == ("s3://b/k", "stage", "why")

    def test_argument_and_item_errors(self):
        assert isinstance(UnsupportedItemError("x"), (TypeError, NotImplementedError))
        assert isinstance(ConfigurationError("x"), (ValueError, RuntimeError))

    def test_json_fields_survive_a_worker(self):
        pipe = IterableWrapper(range(4)).sharding_filter().map(_bad_json)
        with pytest.raises(json.JSONDecodeError) as info:
            list(pipekit.DataLoader(pipe, num_workers=1))
        assert isinstance(info.value, JSONParseError)
        assert (info.value.url, info.value.stage) == ("s3://b/0.json", "parse_json_files")


class TestSkipLog:
    def test_counts_keeps_and_logs(self, caplog):
        log = SkipLog("decode_image", max_kept=2)
        with caplog.at_level(logging.WARNING, logger="pipekit"):
            for i in range(3):
                log.record(StageError("decode image", f"f{i}.jpg", "decode_image", "bad"))
        assert log.count == 3
        assert [s.url for s in log.skipped] == ["f0.jpg", "f1.jpg"]
        assert "skipped 'f2.jpg'" in caplog.text
        assert "3 skipped so far" in caplog.text
        log.reset()
        assert log.count == 0
        assert log.skipped == []

    def test_plain_exceptions_and_pickling(self):
        log = SkipLog("x")
        log.record(KeyError("k"), url="item 3")
        assert log.skipped[0].reason == "KeyError: 'k'"
        copy = pickle.loads(pickle.dumps(log))
        assert copy.count == 1
        copy.record(ValueError("v"), url="item 4")  # the lock survives pickling
        assert copy.count == 2


class TestSkipReport:
    def test_summary_is_plain_data_of_the_first_items(self):
        log = SkipLog("decode", max_kept=100)
        for i in range(15):
            log.record(StageError("decode", f"f{i}.jpg", "decode", "bad"))
        summary = log.summary(first=3)
        items = {i: [f"f{i}.jpg", "decode", "bad"] for i in range(3)}
        assert summary == {"stage": "decode", "count": 15, "items": items}

    def test_adds_up_pipes_and_workers(self):
        a, b = SkipLog("decode"), SkipLog("load_from_tar")
        a.record(StageError("decode", "x.jpg", "decode", "not a JPEG"))
        b.record(StageError("read archive", "s.tar", "load_from_tar", "truncated"))
        report = SkipReport.from_summaries([a.summary(), b.summary(), a.summary(), SkipLog("idle").summary()])
        assert report.count == 3
        assert report.counts == {"decode": 2, "load_from_tar": 1}
        assert [s.url for s in report.skipped] == ["x.jpg", "s.tar", "x.jpg"]
        assert str(report).splitlines()[0] == "3 items skipped (decode: 2, load_from_tar: 1)"
        assert "load_from_tar: 's.tar': truncated" in str(report)
        assert str(SkipReport()) == "nothing skipped" and SkipReport().count == 0

    def test_exported(self):
        assert {"SkipReport", "WorkerDiedError"} <= set(pipekit.errors.__all__)


def test_worker_died_error_keeps_its_fields():
    message = "DataLoader worker (pid(s) 7) exited unexpectedly: ..."
    err = WorkerDiedError(message, 1, 7, "SIGKILL", "a.tar", "load_from_tar")
    copy = pickle.loads(pickle.dumps(err))
    assert isinstance(copy, RuntimeError) and str(copy) == str(err)
    assert (copy.worker_id, copy.pid, copy.signal, copy.url, copy.stage) == (1, 7, "SIGKILL", "a.tar", "load_from_tar")


def test_check_on_error():
    assert check_on_error("skip") == "skip"
    with pytest.raises(ValueError, match='"raise" or "skip"'):
        check_on_error("ignore")


# -- the hierarchy -----------------------------------------------------------------------------------


def _base_names(cls: type) -> list[str]:
    """``cls``'s bases outside pipekit's tree, by the names users catch them by (private helpers looked through)."""
    import pipekit.errors as errors

    names = []
    for base in cls.__bases__:
        if issubclass(base, errors.PipekitError) or base is Exception:
            continue
        if base.__name__.startswith("_"):
            names.extend(_base_names(base))
        else:
            # where users import it from: _csv -> csv, json.decoder -> json
            module = base.__module__.lstrip("_").split(".")[0]
            names.append(base.__name__ if module == "builtins" else f"{module}.{base.__qualname__}")
    return names


def _tree() -> str:
    import inspect

    import pipekit.errors as errors

    classes = [
        c for _, c in inspect.getmembers(errors, inspect.isclass)
        if issubclass(c, errors.PipekitError) and c.__module__ == "pipekit.errors" and not c.__name__.startswith("_")
    ]

    def parent(c: type) -> type:
        return next(b for b in c.__bases__ if issubclass(b, errors.PipekitError))

    lines: list[str] = []

    def walk(cls: type, depth: int) -> None:
        others = _base_names(cls)
        lines.append("    " * depth + cls.__name__ + (f" ({', '.join(others)})" if others else ""))
        children = [c for c in classes if c is not errors.PipekitError and parent(c) is cls]
        for sub in sorted(children, key=lambda c: c.__name__):
            walk(sub, depth + 1)

    walk(errors.PipekitError, 0)
    return "\n".join(lines)


def test_the_docstring_draws_the_exception_tree():
    """pipekit.errors' docstring shows every exception and what else each one is, as the classes say."""
    import textwrap

    import pipekit.errors as errors

    drawn = textwrap.dedent(errors.__doc__.split("The exception tree::\n\n", 1)[1].split("\n\n", 1)[0])
    assert drawn.strip("\n") == _tree(), "update the tree in pipekit/errors.py's docstring:\n" + _tree()


def test_every_exception_of_pipekit_is_a_pipekit_error_in_errors():
    """Every public exception class pipekit defines lives in pipekit.errors and derives from PipekitError."""
    import ast
    import pathlib

    import pipekit

    src = pathlib.Path(pipekit.__file__).parent
    elsewhere = []
    for path in sorted(src.rglob("*.py")):
        if path.name == "errors.py" and path.parent == src:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                bases = {ast.unparse(b) for b in node.bases}
                if any(b.endswith(("Error", "Exception")) for b in bases) or node.name.endswith("Error"):
                    elsewhere.append(f"{path.relative_to(src)}:{node.lineno}: {node.name}")
    assert elsewhere == [], "define exceptions in pipekit/errors.py, under PipekitError:\n" + "\n".join(elsewhere)


def test_an_error_that_is_an_import_error_takes_its_keywords():
    """``DependencyNotFoundError`` is a ``ModuleNotFoundError``: ``name=`` reaches it, and the message is redacted."""
    from pipekit.errors import DependencyNotFoundError

    err = DependencyNotFoundError("needs lightning (see https://u:secret@example.com/x)", name="lightning")
    assert err.name == "lightning" and "secret" not in str(err)
