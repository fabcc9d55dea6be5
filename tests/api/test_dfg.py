import pytest

from realrl.api.core.dfg import MFCDef, ModelInterfaceType, build_graph, draw_graph, graph_to_dot
from realrl.experiments.ppo_graph import PPO_DATASET_KEYS, ppo_mfcs


def node(name, inputs=(), outputs=(), model="actor", type_="inference"):
    return MFCDef(
        name=name,
        model_name=model,
        interface_type=type_,
        interface_impl="x",
        input_keys=inputs,
        output_keys=outputs,
    )


def test_ppo_graph_edges_match_design():
    g = build_graph(ppo_mfcs(n_seqs=4), dataset_keys=PPO_DATASET_KEYS)
    expected = {
        ("actor_gen", "rew_inf"),
        ("actor_gen", "ref_inf"),
        ("actor_gen", "critic_inf"),
        ("actor_gen", "compute_adv"),
        ("actor_gen", "actor_train"),
        ("actor_gen", "critic_train"),
        ("rew_inf", "compute_adv"),
        ("ref_inf", "compute_adv"),
        ("ref_inf", "actor_train"),
        ("critic_inf", "compute_adv"),
        ("compute_adv", "actor_train"),
        ("compute_adv", "critic_train"),
    }
    assert set(g.edges) == expected
    assert g.edges["actor_gen", "critic_inf"]["keys"] == ["packed_input_ids", "seq_no_eos_mask"]
    assert g.edges["rew_inf", "compute_adv"]["keys"] == ["rewards"]
    assert g.edges["compute_adv", "actor_train"]["keys"] == ["advantages", "ppo_loss_mask"]
    assert g.edges["compute_adv", "critic_train"]["keys"] == ["old_values", "returns", "ppo_loss_mask"]
    assert g.nodes["actor_gen"]["mfc"].interface_type is ModelInterfaceType.GENERATE
    assert g.nodes["compute_adv"]["mfc"].whole_batch
    assert {n: g.nodes[n]["mfc"].model_name.role for n in g} == {
        "actor_gen": "actor",
        "rew_inf": "reward",
        "ref_inf": "ref",
        "critic_inf": "critic",
        "compute_adv": "adv",
        "actor_train": "actor",
        "critic_train": "critic",
    }
    assert g.graph["dataset_keys"] == ["packed_prompts"]


def test_duplicate_names():
    with pytest.raises(ValueError, match=r"duplicate MFC names: \['a'\]"):
        build_graph([node("a"), node("a")])


def test_two_producers():
    with pytest.raises(ValueError, match="'k' is produced by two MFCs: 'a' and 'b'"):
        build_graph([node("a", outputs=["k"]), node("b", outputs=["k"])])


def test_cycle():
    with pytest.raises(ValueError, match="cycle: .*a.*b"):
        build_graph([node("a", ["y"], ["x"]), node("b", ["x"], ["y"])])


def test_missing_keys_and_dataset_conflicts():
    with pytest.raises(ValueError, match="'z' needed by \\['b'\\]"):
        build_graph([node("a", ["p"], ["x"]), node("b", ["x", "z"])], dataset_keys=["p"])
    with pytest.raises(ValueError, match="'x' \\(by 'a'\\)"):
        build_graph([node("a", ["p"], ["x"])], dataset_keys=["p", "x"])
    g = build_graph([node("a", ["p"], ["x"]), node("b", ["x", "z"])])  # no dataset keys: inferred
    assert g.graph["dataset_keys"] == ["p", "z"]


def test_mfcdef_validation():
    with pytest.raises(ValueError, match="interface_type 'fly'"):
        node("a", type_="fly")
    with pytest.raises(ValueError, match="n_seqs"):
        MFCDef("a", "actor", "generate", "x", n_seqs=0)
    with pytest.raises(ValueError, match="repeat"):
        node("a", inputs=["x", "x"])
    with pytest.raises(ValueError, match="input_key_remap"):
        MFCDef("a", "actor", "generate", "x", input_keys=["x"], input_key_remap={"y": "z"})


def test_draw_dot_and_png(tmp_path):
    g = build_graph(ppo_mfcs(n_seqs=4), dataset_keys=PPO_DATASET_KEYS)
    dot = graph_to_dot(g)
    assert '"actor_gen" -> "critic_inf" [label="packed_input_ids, seq_no_eos_mask"]' in dot
    assert 'dataset -> "actor_gen"' in dot
    draw_graph(g, str(tmp_path / "g.dot"))
    assert (tmp_path / "g.dot").read_text() == dot
    png = tmp_path / "g.png"
    draw_graph(g, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert "layer" not in g.nodes["actor_gen"]
    with pytest.raises(ValueError, match="svg"):
        draw_graph(g, str(tmp_path / "g.svg"))
