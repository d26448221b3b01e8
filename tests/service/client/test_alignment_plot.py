"""Alignment pictures: readable byte-level BPE labels, the heatmap's grid and labels, and
`mtserve translate --alignment` writing the PNG from a running server."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")

from PIL import Image  # matplotlib depends on pillow

from mtserve.cli import main
from service.client import alignment_matrix
from service.client.alignment_plot import DPI, alignment_figure, figure_size, readable_tokens, save_alignment

TEXT = "Ein Hund rennt durch den Schnee."


def test_readable_tokens():
    tokens = ["ĠEin", "ĠMÃ¤", "n", "ner", "Ġr", "en", ".", "Ġ", "</s>", "<unk>"]
    assert readable_tokens(tokens) == ["Ein", "Mä", "·n", "·ner", "r", "·en", ".", "␣", "</s>", "<unk>"]
    assert readable_tokens(["Ġ\u00c3"]) == ["\ufffd"]  # half of a two-byte character


def test_figure_grid_and_labels():
    weights = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1]], dtype=np.float32)
    fig = alignment_figure(["ĠHund", "e", "</s>"], ["ĠDog", "</s>"], weights, title="Hunde -> Dog")
    (ax, _colorbar) = fig.axes
    (image,) = ax.get_images()
    np.testing.assert_array_equal(image.get_array(), weights)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["Hund", "·e", "</s>"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["Dog", "</s>"]
    with pytest.raises(ValueError, match="expected"):
        alignment_figure(["a"], ["b"], weights)


@pytest.fixture(scope="module")
def server(make_server):
    return make_server()


def test_translate_alignment_writes_the_picture(server, tmp_path, capsys):
    out = tmp_path / "alignment.png"
    assert main(["translate", "--server", server.address, "--beam", "2", "--alignment", str(out), TEXT]) == 0
    printed = capsys.readouterr()
    with server.client() as c:
        (t,) = c.translate([TEXT], beam_size=2, return_alignment=True)
    assert printed.out.strip() == t.text and str(out) in printed.err

    # The picture is the figure for this alignment: its pixel size follows from the token grid.
    n_tgt, n_src = alignment_matrix(t).shape
    width, height = figure_size(n_src, n_tgt)
    with Image.open(out) as png:
        assert png.format == "PNG"
        assert abs(png.size[0] - width * DPI) <= 1 and abs(png.size[1] - height * DPI) <= 1
        pixels = np.asarray(png.convert("L"))
    assert pixels.min() < 64 and pixels.max() > 192  # dark cells and labels on a white page

    fig = save_alignment(t, tmp_path / "again.png", source_text=TEXT)
    ax = fig.axes[0]
    assert ax.get_images()[0].get_array().shape == (n_tgt, n_src)
    assert [x.get_text() for x in ax.get_xticklabels()] == readable_tokens(list(t.alignment.source_tokens))
    assert [y.get_text() for y in ax.get_yticklabels()] == readable_tokens(list(t.alignment.target_tokens))
    assert "Hund" in [x.get_text() for x in ax.get_xticklabels()]


def test_several_texts_give_numbered_pictures(server, tmp_path, capsys):
    out = tmp_path / "a.png"
    assert (
        main(["translate", "--server", server.address, "--beam", "1", "--alignment", str(out), TEXT, "Ein Kind lacht."])
        == 0
    )
    assert (tmp_path / "a-1.png").is_file() and (tmp_path / "a-2.png").is_file() and not out.exists()
    assert len(capsys.readouterr().out.strip().splitlines()) == 2
