"""The stored notebooks as a reader opens them: every cell that draws a figure shows it.

A figure cell saves its figure with ``ssd.analysis.style.save``; the stored notebook must keep the picture itself
(an ``image/png`` output), not only the path the cell returns. Once a figure made in the kit's style closed
matplotlib's interactive mode behind it (``ssd.analysis.style.styled``), and eight cells of the course kept only a
path: this reads the stored files, so it needs no kernel.
"""
import json
import pathlib

import pytest

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def figure_cells(notebook: pathlib.Path) -> list[tuple[int, dict]]:
    cells = json.loads(notebook.read_text())["cells"]
    return [(i, c) for i, c in enumerate(cells) if c["cell_type"] == "code" and "style.save(" in "".join(c["source"])]


def shows_an_image(cell: dict) -> bool:
    return any("image/png" in output.get("data", {}) for output in cell.get("outputs", []))


def test_the_course_is_read_and_draws_figures():
    assert len(NOTEBOOKS) >= 9
    assert sum(len(figure_cells(nb)) for nb in NOTEBOOKS) >= 15


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_figure_cell_of_a_stored_notebook_shows_its_figure(notebook):
    missing = [i for i, cell in figure_cells(notebook) if not shows_an_image(cell)]
    assert not missing, f"{notebook.name}: cells {missing} save a figure but the stored notebook shows none"


def test_a_cell_with_only_the_path_is_caught():
    path_only = {"cell_type": "code", "source": ["style.save(fig, 'a.png')"],
                 "outputs": [{"output_type": "execute_result", "data": {"text/plain": ["'a.png'"]}}]}
    assert not shows_an_image(path_only)
    assert shows_an_image(path_only | {"outputs": [{"output_type": "display_data", "data": {"image/png": "iVBO"}}]})


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_figure_of_a_stored_notebook_names_its_machine_and_precision(notebook):
    missing = [i for i, cell in figure_cells(notebook) if "style.caption(" not in "".join(cell["source"])]
    assert not missing, f"{notebook.name}: cells {missing} save a figure without style.caption under it"
