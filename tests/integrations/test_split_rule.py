"""The split rule (avsg.cache.split_rule): both sides of its thresholds, derived from the price
it states (docs/overlap.md section 5), never an overlap the cores or a measurement do not grant,
and the serving core's ``step(split="auto")`` deciding by that same function."""
import dataclasses

import pytest
import torch

from avsg.cache import split_rule
from avsg.cache.split_rule import SPLIT_LAUNCHES, SplitPolicy, SplitProfile

from test_serving_manager import K, R, T, block_table, decode_inputs, make

# a profile whose copy is link-bound on any number of cores (t_row = 0), so the threshold
# below has a closed form; the numbers are arbitrary, the thresholds follow from them
PROFILE = SplitProfile(aiv_cores=40, attention_cores=20, gather_cores=20,
                       link_bytes_per_s=25e9, row_bytes=1152, row_latency_s=0.0,
                       attention_fixed_s=5e-6, attention_s_per_selection=1e-8,
                       merge_s_per_token=0.7e-6)
LAUNCH = 2e-6


def _link(profile, misses):
    return misses * profile.row_bytes / profile.link_bytes_per_s


def threshold_misses(profile, rows, launch_s):
    """T = 1, o = 1, the copy hidden behind the hits' attention: the gain is
    copy - t_a0 - t_merge - len(SPLIT_LAUNCHES)·t_L, zero at this many misses."""
    fixed = profile.attention_fixed_s + rows * profile.merge_s_per_token \
        + len(SPLIT_LAUNCHES) * launch_s
    return fixed * profile.link_bytes_per_s / profile.row_bytes


@pytest.mark.parametrize("rows", [1, 8])
def test_the_rule_splits_just_above_its_miss_threshold_and_not_below(rows):
    m = threshold_misses(PROFILE, rows, LAUNCH)
    # the closed form holds where the hits' attention still hides the copy
    hits = split_rule.attention_s(PROFILE, rows * 2048 - m)
    assert _link(PROFILE, m * 1.01) < hits
    for misses, chosen in ((m * 0.99, False), (m * 1.01, True)):
        p = split_rule.price(PROFILE, rows, 1, 2048, misses, LAUNCH, True)
        assert p.overlap == 1 and p.chosen is chosen
        assert split_rule.choose_split(PROFILE, rows, 1, 2048, misses, LAUNCH, True) is chosen
        assert p.gain_s == pytest.approx(_link(PROFILE, misses) - (
            _link(PROFILE, m)), abs=1e-12)
        assert p.launches == (len(SPLIT_LAUNCHES) if chosen else 0)


def test_the_rule_weighs_the_launch_cost_on_both_sides():
    rows, misses = 8, 2000.0
    copy = _link(PROFILE, misses)
    # gain = copy - t_a0 - t_merge - n·t_L: zero at this launch cost
    t_l = (copy - PROFILE.attention_fixed_s - rows * PROFILE.merge_s_per_token) \
        / len(SPLIT_LAUNCHES)
    assert t_l > 0
    assert split_rule.choose_split(PROFILE, rows, 1, 2048, misses, t_l * 0.99, True)
    assert not split_rule.choose_split(PROFILE, rows, 1, 2048, misses, t_l * 1.01, True)


def test_the_copy_longer_than_the_hits_attention_gains_only_the_attention():
    """Past the hits' attention the overlap hides only that attention: the gain is
    t_attn(K_hit) - t_a0 - t_merge - n·t_L - (t_copy(C) - t_copy(P)), here with the copy on
    fewer cores latency-bound."""
    prof = dataclasses.replace(PROFILE, row_latency_s=1e-6, gather_cores=10)
    rows, misses = 1, 2000.0
    p = split_rule.price(prof, rows, 1, 2048, misses, LAUNCH, True)
    hit = split_rule.attention_s(prof, 2048 - misses)
    copy_c, copy_p = split_rule.copy_s(prof, misses, 10), split_rule.copy_s(prof, misses, 40)
    assert copy_c > hit and copy_c > copy_p
    assert p.gain_s == pytest.approx(hit - prof.attention_fixed_s - prof.merge_s_per_token
                                     - len(SPLIT_LAUNCHES) * LAUNCH - (copy_c - copy_p))


@pytest.mark.parametrize("misses", [0.0, 10.0, 1e3, 1e5, 1e7])
@pytest.mark.parametrize("rows,tokens", [(1, 1), (8, 1), (8, 4), (64, 4)])
def test_no_overlap_no_split(misses, rows, tokens):
    """o = 0 without an established overlap, and where attention + gather cores exceed the
    device's even when it is established: the split then only adds work, at any misses."""
    crowded = dataclasses.replace(PROFILE, attention_cores=40, gather_cores=1)
    for profile, established in ((PROFILE, False), (crowded, True), (crowded, False)):
        p = split_rule.price(profile, rows, tokens, 2048, misses, 0.0, established)
        assert p.overlap == 0 and not p.chosen and p.gain_s <= 0


def test_the_split_never_costs_more_than_the_rule_admits():
    """Following the rule, the priced time is min(unsplit, split): never above the unsplit."""
    for misses in (1.0, 50.0, 500.0, 5000.0):
        for tokens in (1, 2, 4):
            for launch in (0.0, 2e-6, 10e-6):
                p = split_rule.price(PROFILE, 8, tokens, 2048, misses, launch, True)
                assert p.chosen == (p.split_s < p.unsplit_s)
                assert (p.split_s if p.chosen else p.unsplit_s) <= p.unsplit_s


@pytest.mark.parametrize("bad", [dict(aiv_cores=0), dict(gather_cores=41),
                                 dict(attention_cores=2.5), dict(link_bytes_per_s=0.0),
                                 dict(row_latency_s=-1.0), dict(merge_s_per_token=float("nan"))])
def test_profile_refuses_bad_numbers_naming_the_field(bad):
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        dataclasses.replace(PROFILE, **bad)


def test_policy_and_price_refuse_bad_input():
    with pytest.raises(TypeError, match="overlap_established"):
        SplitPolicy(PROFILE, LAUNCH, overlap_established=1)
    with pytest.raises(ValueError, match="launch_s"):
        SplitPolicy(PROFILE, -1.0)
    with pytest.raises(ValueError, match="misses"):
        split_rule.price(PROFILE, 1, 1, 2048, -1.0, LAUNCH, True)


# ------------------------------------------------------------------- the serving core's "auto"

def _step(mgr, split):
    for row in range(R):
        mgr.add(row)
    outs = []
    for step in range(3):
        qsl, seq, topk = decode_inputs(step)
        rtk = mgr.begin_step_rtk(seq + 1, T, block_table(), torch.ones(R, dtype=torch.bool))
        outs.append(mgr.step(0, topk.view(R, T, K), rtk, split=split))
    return outs


def test_auto_needs_a_policy_and_refuses_other_values():
    mgr, _ = make()
    with pytest.raises(ValueError, match="split"):
        _step(mgr, "auto")
    mgr, _ = make()
    with pytest.raises(TypeError, match="split"):
        _step(mgr, "yes")
    with pytest.raises(TypeError, match="split_policy"):
        make(split_policy=PROFILE)


def test_auto_without_an_established_overlap_is_the_one_pass_path_bit_for_bit():
    plain = _step(make()[0], False)
    auto = _step(make(split_policy=SplitPolicy(PROFILE, LAUNCH, False, 1e6))[0], "auto")
    for a, b in zip(plain, auto):
        assert b.split is None
        assert torch.equal(a.slots, b.slots) and torch.equal(a.host_pos, b.host_pos)


# the manager tests' tiny top-k (K = 8) needs a slow link and a slow attention for a copy worth
# hiding behind the hits' attention
SMALL = dataclasses.replace(PROFILE, link_bytes_per_s=1e6, attention_s_per_selection=1e-3)


@pytest.mark.parametrize("expected,splits", [(None, False), (0.0, False), (2.0, True)])
def test_auto_with_an_established_overlap_follows_the_rule(expected, splits):
    """Expected misses: the rule splits (the same lists as split=True); none: it does not."""
    policy = SplitPolicy(SMALL, LAUNCH, True, expected)
    assert split_rule.choose_split(SMALL, R, T, K, (expected or 0.0) * R, LAUNCH, True) is splits
    assert policy.choose(R, T, K) is splits
    auto = _step(make(split_policy=policy)[0], "auto")
    forced = _step(make()[0], splits)
    for a, b in zip(auto, forced):
        assert (a.split is not None) is splits
        assert torch.equal(a.slots, b.slots)
        if splits:
            assert torch.equal(a.split.hits, b.split.hits)
            assert torch.equal(a.split.misses, b.split.misses)


def test_the_decode_model_and_the_serving_core_decide_by_the_same_function(monkeypatch):
    """One rule in one place: replace split_rule.price and both the model's split mode and
    the manager's "auto" follow the replacement."""
    from avsg.lab.costmodel import hardware, plan_cost, projection
    from avsg.lab.costmodel.traffic import Traffic
    from avsg.model_config import from_hf_config
    config = from_hf_config(projection.V32_CONFIG)
    traffic = Traffic(0, 0.0, 1.0, 8192, 4096, {"avsg": [120.0, 80.0]}, "test")
    costs = plan_cost.Costs({"avsg": {1: 30.0}}, 0.0, "test")
    calls = []
    real = split_rule.price

    def always(*args, **kwargs):
        calls.append(args[1:4])
        p = real(*args, **kwargs)
        return dataclasses.replace(p, chosen=True, launches=len(SPLIT_LAUNCHES))
    monkeypatch.setattr(split_rule, "price", always)
    hw = hardware.load_profile()
    hw.override("hbm_bytes", 1e15, "test: no memory limit")
    r = projection.project(config, hw, traffic, costs, 1, 32768, 32,
                           modes=("avsg-split-o0",))["avsg-split-o0"]
    assert r["split"]["layers_split"] == 1.0 and calls
    model_calls = len(calls)
    # the same policy never splits on its own (no established overlap) ...
    policy = SplitPolicy(PROFILE, LAUNCH, False)
    out = _step(make(split_policy=policy)[0], "auto")
    assert len(calls) > model_calls and all(o.split is not None for o in out)
    monkeypatch.setattr(split_rule, "price", real)
    assert all(o.split is None for o in _step(make(split_policy=policy)[0], "auto"))


def test_the_runtime_split_makes_the_calls_split_launches_names(monkeypatch):
    """The runtime's split attention: the unsplit path's one attention becomes two partial
    attentions and a merge; what it adds is SPLIT_LAUNCHES."""
    from avsg.runtime.algo import dsa
    launched = []
    partial, merge = dsa.sparse_mla_partial, dsa.merge_attention

    def counted_partial(*args, **kwargs):
        launched.append("attention")
        return partial(*args, **kwargs)

    def counted_merge(*args, **kwargs):
        launched.append("attention_update")
        return merge(*args, **kwargs)
    monkeypatch.setattr(dsa, "sparse_mla_partial", counted_partial)
    monkeypatch.setattr(dsa, "merge_attention", counted_merge)
    rows, tokens, heads, C, P, Kr = 2, 1, 2, 8, 4, 4
    view = (torch.randn(rows, 6, C), torch.randn(rows, 6, P))
    index = torch.randint(0, 6, (rows, tokens, Kr), dtype=torch.int32)
    split = (index, torch.full_like(index, -1))
    retrieved = dsa.Retrieved(view=view, index=index, split=split)

    class Attn(torch.nn.Module):
        softmax_scale = 0.5

        def w_uv(self):
            return torch.ones(heads, 3, C)
    dsa.split_mla_attention(Attn(), torch.randn(rows, tokens, heads, C),
                            torch.randn(rows, tokens, heads, P), retrieved)
    # the lists' launch is the serving step's (test_serving_manager.py counts that one)
    assert launched[0] == "attention" and ["split_slots"] + launched[1:] == list(SPLIT_LAUNCHES), launched
