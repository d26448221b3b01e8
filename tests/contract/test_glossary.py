"""The glossary file format (contract/glossary.py): terms with their lines, comments and blank
lines skipped, and a refusal naming the file and line for anything else."""

from __future__ import annotations

import pytest

from contract.glossary import GlossaryFormatError, parse_tsv


def test_terms_forms_comments_and_blank_lines():
    text = "# product names\n\nACME Cloud\tACME Cloud\nHund\tcanine\tHunde | Hundes|\n  \n"
    assert parse_tsv(text, "g.tsv") == [
        (3, "ACME Cloud", "ACME Cloud", ()),
        (4, "Hund", "canine", ("Hunde", "Hundes")),
    ]


@pytest.mark.parametrize(
    "text, problem",
    [
        ("Hund\n", "g.tsv:1: 1 columns"),
        ("a\tb\tc\td\n", "g.tsv:1: 4 columns"),
        ("ok\tfine\n\tcanine\n", "g.tsv:2: the source is empty"),
        ("Hund\t \n", "g.tsv:1: the target is empty"),
    ],
)
def test_a_line_that_is_not_a_term_is_named(text, problem):
    with pytest.raises(GlossaryFormatError, match=problem):
        parse_tsv(text, "g.tsv")
