"""ssd.bench.graphs: a pass on a static cache, the same pass each call, as a graph would replay it (the replay itself is
checked on a GPU: tests/test_gpu.py)."""
import pytest
import torch

from ssd.bench import graphs
from ssd.models.tiny import tiny_pair
from ssd.models.timing import fixed_ids


@pytest.fixture(scope="module")
def target():
    return tiny_pair(vocab_size=64, seed=3).target


@pytest.mark.parametrize("batch, new", [(1, 1), (2, 5)])
def test_a_static_pass_gives_the_full_forwards_logits_every_call(target, batch, new):
    context = 16
    run = graphs.static_pass(target, batch, new, context=context)
    with torch.inference_mode():
        first, again = run().clone(), run()
        ids = fixed_ids(target, context + new)[None].expand(batch, -1)
        full = target(input_ids=ids).logits[:, context:]
    assert torch.equal(first, again)  # the write position was put back: the same pass each call
    torch.testing.assert_close(first, full, rtol=1e-5, atol=1e-5)


def test_pass_ms_times_eager_here_and_refuses_a_graph_off_cuda(target):
    assert graphs.pass_ms(target, 2, 1, graph=False, context=16, reps=2) > 0
    with pytest.raises(ValueError, match="graph=True needs a CUDA device; the model is on cpu"):
        graphs.pass_ms(target, 1, 1, graph=True, context=16)
