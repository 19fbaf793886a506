"""Figures (bandcore.plot): files written as PNG/PDF, not blank, and plotting exactly band()'s values."""

import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import numpy as np
import pytest

from bandcore.band import band
from bandcore.cli import main
from bandcore.plot import plot_bounds, plot_ratio, plot_region


def _lines(fig):
    return {line.get_label(): line for ax in fig.axes for line in ax.get_lines()}


def _not_blank(path):
    image = mpimg.imread(path)
    gray = image[..., :3].mean(axis=-1)
    assert image.shape[0] > 300 and image.shape[1] > 300
    assert (gray < 0.5).mean() > 0.005  # dark ink: curves, labels
    assert gray.std() > 0.05


def test_bounds_plots_delta_pi_of_the_band_and_the_clips(tmp_path):
    out = tmp_path / "bounds.png"
    fig = plot_bounds(0.05, ("kl", "js"), out=out)
    _not_blank(out)
    up_axis, lo_axis = fig.axes[:2]
    up_lines = {line.get_label(): line for line in up_axis.get_lines()}
    p = up_lines["Band: kl"].get_xdata()
    lower, upper = band(np.log(p), "kl", 0.05)
    np.testing.assert_allclose(up_lines["Band: kl"].get_ydata(), p * (upper - 1), rtol=1e-14)
    lo_lines = {line.get_label(): line for line in lo_axis.get_lines()}
    np.testing.assert_allclose(lo_lines["Band: kl"].get_ydata(), p * (lower - 1), rtol=1e-14, atol=1e-300)
    np.testing.assert_allclose(up_lines["PPO clip ε=0.2"].get_ydata(), 0.2 * p)
    np.testing.assert_allclose(up_lines["clip-higher ε=0.2/0.28"].get_ydata(), 0.28 * p)
    # the Band respects the simplex: Δπ <= 1 - p, and gives tail tokens more room than PPO
    assert np.all(up_lines["Band: js"].get_ydata() <= 1 - p + 1e-15)
    assert up_lines["Band: kl"].get_ydata()[0] > 50 * up_lines["PPO clip ε=0.2"].get_ydata()[0]
    assert fig.axes[0].get_title() and fig.axes[0].get_xlabel() and fig.axes[0].get_legend()
    plt.close(fig)


def test_ratio_plots_the_bounds_on_log_axes(tmp_path):
    out = tmp_path / "ratio.pdf"
    fig = plot_ratio(0.05, ("hellinger",), out=out)
    assert out.read_bytes().startswith(b"%PDF") and out.stat().st_size > 5_000
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    lines = _lines(fig)
    p = lines["Band: hellinger"].get_xdata()
    lower, upper = band(np.log(p), "hellinger", 0.05)
    np.testing.assert_array_equal(lines["Band: hellinger"].get_ydata(), upper)
    np.testing.assert_array_equal(lines["Band lower: hellinger"].get_ydata(), lower)
    plt.close(fig)


def test_region_shades_where_the_surrogate_is_flat(tmp_path):
    out = tmp_path / "region.png"
    fig = plot_region("kl", 0.05, out=out)
    _not_blank(out)
    positive, negative = fig.axes[:2]
    up = {line.get_label(): line for line in positive.get_lines()}["Band (kl) r_up"]
    lo = {line.get_label(): line for line in negative.get_lines()}["Band (kl) r_lo"]
    lower, upper = band(np.log(up.get_xdata()), "kl", 0.05)
    np.testing.assert_array_equal(up.get_ydata(), upper)
    np.testing.assert_array_equal(lo.get_ydata(), lower)
    assert "A > 0" in positive.get_title() and "A < 0" in negative.get_title()
    plt.close(fig)


def test_cli_writes_each_figure(tmp_path, capsys):
    for figure in ("bounds", "ratio"):
        assert main(["plot", figure, "--delta", "0.05", "--out", str(tmp_path / f"{figure}.png")]) == 0
        _not_blank(tmp_path / f"{figure}.png")
    out = tmp_path / "region.pdf"
    assert main(["plot", "region", "--divergence", "hellinger", "--delta", "0.1", "--out", str(out)]) == 0
    assert out.read_bytes().startswith(b"%PDF")


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(delta=0.05, out="fig.svg"), "out must end"), (dict(delta=-1.0), "delta"), (dict(eps=1.5), "eps")],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plot_ratio(**kwargs)


def test_cli_takes_every_spelling_and_names_bad_options(tmp_path, capsys):
    out = tmp_path / "ratio.png"
    assert main(["plot", "ratio", "--divergences", "alpha(0.5)", "(u-1)**2", "--out", str(out)]) == 0
    _not_blank(out)
    assert main(["plot", "region", "--divergence", "klx", "--out", str(tmp_path / "r.png")]) == 2
    assert "unknown divergence 'klx'" in capsys.readouterr().err
    assert main(["plot", "bounds", "--delta", "nan", "--out", str(tmp_path / "b.png")]) == 2
    assert "--delta" in capsys.readouterr().err
    assert main(["plot", "bounds", "--eps", "1.5", "--out", str(tmp_path / "b.png")]) == 2
    assert main(["plot", "bounds", "--out", str(tmp_path / "b.svg")]) == 2
    assert "--out must end in one of .png, .pdf" in capsys.readouterr().err
    assert not (tmp_path / "b.png").exists() and not (tmp_path / "b.svg").exists()


def test_functions_take_divergence_objects_and_formulas():
    from bandcore.divergences import resolve

    fig = plot_ratio(0.05, [resolve("hellinger"), "(u-1)**2"])
    labels = {line.get_label() for line in fig.axes[0].get_lines()}
    assert {"Band: hellinger", "Band: (u - 1)**2"} <= labels
    plt.close(fig)
