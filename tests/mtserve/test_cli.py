"""The `mtserve` command line's one error boundary (mtserve/cli.py): bad input to any subcommand
ends in one line on stderr naming the problem, status 2 for bad usage and 1 for a failed
operation, never a traceback; a bug ends in one line too, with how to see its traceback."""

from __future__ import annotations

import pytest

from mtserve import cli
from mtserve.cli import main

# (arguments, what the line names, exit status)
BAD = {
    "no command": ([], "COMMAND", 2),
    "unknown command": (["bogus"], "invalid choice: 'bogus'", 2),
    "import without a path": (["import"], "path, --name", 2),
    "import of no folder": (["import", "/nonexistent", "--name", "x"], "/nonexistent is not a folder", 2),
    "shortlist without a model": (["shortlist"], "--model", 2),
    "translate without texts": (["translate", "--server", "localhost:1"], "give texts or --input FILE", 2),
    "translate timeout not a number": (["translate", "--timeout", "soon", "x"], "--timeout", 2),
    "translate half a client cert": (["translate", "--client-cert", "c.pem", "x"], "--client-key", 2),
    "translate unreachable": (["translate", "--server", "localhost:1", "--timeout", "2", "Hallo"], "UNAVAILABLE", 1),
    "evaluate no model": (["evaluate", "--model", "/nonexistent"], "config.json", 1),
    "evaluate beam not a number": (["evaluate", "--beam", "wide"], "--beam", 2),
    "export no model": (["export", "--model", "/nonexistent"], "/nonexistent/config.json", 1),
    "verify no model": (["verify", "--model", "/nonexistent"], "/nonexistent/config.json", 1),
    "verify unknown flag": (["verify", "--sentences", "-5"], "--sentences", 2),
    "train no data": (["train", "--out", "OUT", "--data", "/nonexistent"], "/nonexistent", 1),
    "train bad model config": (["train", "--out", "OUT", "--model-config", "{bad"], "property name", 1),
    "serve bad setting": (["serve", "--decode-workers", "0"], "decode_workers", 2),
    "serve setting not a number": (["serve", "--max-batch-sentences", "many"], "max_batch_sentences", 2),
    "encode without texts": (["encode"], "texts", 2),
    "translate glossary missing": (["translate", "--glossary", "/nonexistent.tsv", "x"], "--glossary", 2),
    "translate glossary one column": (["translate", "--glossary", "GLOSSARY", "x"], "GLOSSARY:2: 1 columns", 2),
    "translate html and xml": (["translate", "--html", "--xml", "x"], "--xml", 2),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_ends_in_one_line(case, tmp_path, capsys):
    argv, names, status = BAD[case]
    glossary = tmp_path / "glossary.tsv"
    glossary.write_text("# terms\nHund only one column\n", encoding="utf-8")
    names = names.replace("GLOSSARY", str(glossary))
    with pytest.raises(SystemExit) as e:
        main([str(tmp_path / "run") if a == "OUT" else str(glossary) if a == "GLOSSARY" else a for a in argv])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtserve"), err
    assert names in lines[0] and "Traceback" not in err and "unexpected" not in err
    assert e.value.code == status


def test_a_bug_ends_in_one_line_with_a_hint(monkeypatch, capsys):
    def broken(args):
        raise KeyError("oops")

    monkeypatch.setattr(cli, "_run", lambda args: broken(args))
    monkeypatch.delenv(cli.TRACEBACK_ENV, raising=False)
    with pytest.raises(SystemExit) as e:
        main(["verify"])
    err = capsys.readouterr().err
    assert e.value.code == 1 and len(err.strip().splitlines()) == 1
    assert "unexpected KeyError" in err and f"{cli.TRACEBACK_ENV}=1" in err
    monkeypatch.setenv(cli.TRACEBACK_ENV, "1")
    with pytest.raises(KeyError):
        main(["verify"])
