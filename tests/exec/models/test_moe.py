"""exec.models.moe in one process: top-k routing's closed forms, the layer against its definition, one expert as the dense MLP, and the parameters sim.Transformer counts."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from exec.models.layers import Block
from exec.models.moe import MoE, is_expert_param
from exec.models.spec import ModelSpec
from exec.runtime.ep import check_ep, expert_groups, holds_expert
from sim import Transformer

H = 8


def _moe(experts: int, top_k: int, shared: int = 0, seed: int = 0) -> MoE:
    torch.manual_seed(seed)
    return MoE(H, experts, top_k, expert_ffn=12, shared_experts=shared)


@settings(max_examples=25, deadline=None)
@given(experts=st.integers(2, 8), data=st.data(), tokens=st.integers(1, 40))
def test_each_token_goes_to_k_distinct_experts_with_gates_that_sum_to_one(experts, data, tokens):
    k = data.draw(st.integers(1, experts))
    moe = _moe(experts, k)
    gates, chosen = moe.route(torch.randn(tokens, H))
    assert chosen.shape == gates.shape == (tokens, k)
    assert all(len(set(row)) == k for row in chosen.tolist())
    assert int(chosen.min()) >= 0 and int(chosen.max()) < experts
    assert bool((gates > 0).all())
    assert torch.allclose(gates.sum(-1), torch.ones(tokens))


def test_the_k_chosen_experts_are_those_of_the_largest_logits_and_gates_their_softmax():
    moe = _moe(6, 2)
    x = torch.randn(10, H)
    logits = moe.router.gate(x).detach()
    gates, chosen = moe.route(x)
    for t in range(10):
        best = sorted(range(6), key=lambda e: -float(logits[t, e]))[:2]
        assert set(chosen[t].tolist()) == set(best)
        want = torch.softmax(logits[t, chosen[t]], dim=0)  # Mixtral's: the softmax over the k alone
        assert torch.allclose(gates[t], want)


@pytest.mark.parametrize("experts, top_k, shared", [(4, 2, 0), (4, 1, 1), (5, 3, 2)])
def test_the_layer_is_the_gated_sum_of_its_tokens_experts_plus_the_shared_ones(experts, top_k, shared):
    moe = _moe(experts, top_k, shared)
    x = torch.randn(2, 7, H)
    flat = x.reshape(-1, H)
    gates, chosen = moe.route(flat)
    want = torch.stack([sum(g * moe.experts[str(int(e))](flat[t]) for g, e in zip(gates[t], chosen[t]))
                        + sum((s(flat[t]) for s in moe.shared), torch.zeros(H)) for t in range(len(flat))])
    assert torch.allclose(moe(x), want.reshape(x.shape), atol=1e-6)


def test_one_expert_is_the_dense_mlp_with_its_weights():
    moe = _moe(1, 1)
    assert moe.router is None
    block = Block(H, heads=2, ffn=12)
    block.fc1.load_state_dict(moe.experts["0"].fc1.state_dict())
    block.fc2.load_state_dict(moe.experts["0"].fc2.state_dict())
    moe_block = Block(H, heads=2, ffn=12, mlp=moe)
    for name in ("ln1", "qkv", "proj", "ln2"):
        getattr(moe_block, name).load_state_dict(getattr(block, name).state_dict())
    x = torch.randn(3, 5, H)
    assert torch.allclose(moe_block(x), block(x), atol=1e-6)


def test_every_parameter_gets_a_gradient_that_flows_through_routing():
    moe = _moe(4, 2, shared=1)
    moe(torch.randn(64, H)).square().sum().backward()
    assert all(p.grad is not None for p in moe.parameters())
    assert moe.router.gate.weight.grad.abs().sum() > 0  # the gates carry the router's gradient


SMALL = dict(layers=3, hidden=16, heads=2, seq=8, vocab=32, batch_size=4)


@pytest.mark.parametrize("moe", [dict(experts=4, top_k=2), dict(experts=8, top_k=2, expert_ffn=24, shared_experts=1,
                                                                  dense_layers=1), dict(experts=1)])
def test_the_torch_model_has_the_parameters_sim_counts(moe):
    spec = ModelSpec("gpt", **SMALL, **moe)
    t = Transformer(**{k: SMALL[k] for k in ("layers", "hidden", "heads", "seq", "vocab")}, attention="flash",
                    dropout=False, tied=False, **moe)
    assert spec.transformer() == t
    assert ModelSpec.from_transformer(t, batch_size=4).transformer() == t
    assert sum(p.numel() for layer in spec.build_layers() for p in layer.parameters()) == t.params().total
    blocks = spec.build_layers()[1:-1]
    assert [b.moe is not None for b in blocks] == [i >= (moe.get("dense_layers") or 0) for i in range(3)]


def test_a_spec_refuses_experts_where_sim_or_exec_would():
    with pytest.raises(ValueError, match="for model 'gpt'"):
        ModelSpec("mlp", layers=2, experts=4)
    with pytest.raises(ValueError, match="top_k 5 is more than the 4 experts"):
        ModelSpec("gpt", **SMALL, experts=4, top_k=5)
    with pytest.raises(ValueError, match="give experts= too"):
        ModelSpec("gpt", **SMALL, top_k=2)
    assert ModelSpec("gpt", **SMALL, experts=4).top_k == 1  # sim's defaults, filled in


def test_expert_parameters_and_which_ep_rank_holds_them():
    assert is_expert_param("2.moe.experts.3.fc1.weight") and not is_expert_param("2.moe.router.gate.weight")
    assert not is_expert_param("2.moe.shared.0.fc1.weight")
    held = [[e for e in range(8) if holds_expert(f"1.moe.experts.{e}.fc2.bias", 8, 4, r)] for r in range(4)]
    assert held == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert all(holds_expert("1.qkv.weight", 8, 4, r) for r in range(4))


def test_ep_and_edp_groups_fold_into_dp():
    eps, edps = expert_groups(dp=4, ep=2)
    assert eps == [(0, 1), (2, 3)] and edps == [(0, 2), (1, 3)]
    assert expert_groups(dp=4, ep=4) == ([(0, 1, 2, 3)], [(0,), (1,), (2,), (3,)])
    check_ep(1, 1, None)
    for ep, dp, experts, match in ((2, 1, 4, "must divide dp=1"), (4, 4, 6, "divide the 6 experts"),
                                   (2, 2, None, "the model has none"), (0, 2, 4, "integer >= 1")):
        with pytest.raises(ValueError, match=match):
            check_ep(ep, dp, experts)
