"""Sharding rules, mesh validation and placement on the one device of the test process.

The multi-device proofs (equality with one device, multi-process) run in subprocesses:
tests/test_sharding_multidevice.py.
"""

import jax
import numpy as np
import pytest
from conftest import tiny_config
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from seq2seq.config import Config, ConfigError, DistributedConfig, MeshConfig, load_config
from seq2seq.sharding import (
    RULES,
    MeshError,
    Partitioner,
    check_model,
    format_rules,
    initialize_distributed,
    logical_to_mesh,
    make_mesh,
    mesh_shape,
)
from seq2seq.training.step import abstract_train_state

AXES = ("data", "fsdp", "tensor")


def _mesh(data, fsdp, tensor):
    return AbstractMesh((data, fsdp, tensor), AXES)


@pytest.mark.parametrize(
    "cfg, devices, expected",
    [
        (MeshConfig(), 8, (8, 1, 1)),
        (MeshConfig(data=-1, fsdp=2, tensor=2), 8, (2, 2, 2)),
        (MeshConfig(data=2, fsdp=-1, tensor=1), 8, (2, 4, 1)),
        (MeshConfig(data=1, fsdp=1, tensor=-1), 8, (1, 1, 8)),
        (MeshConfig(data=2, fsdp=2, tensor=2), 8, (2, 2, 2)),
        (MeshConfig(), 1, (1, 1, 1)),
    ],
)
def test_mesh_shape_fills_the_remaining_devices(cfg, devices, expected):
    assert mesh_shape(cfg, devices) == expected


@pytest.mark.parametrize(
    "cfg, devices, message",
    [
        (MeshConfig(data=2, fsdp=2, tensor=1), 8, "needs 4 devices but there are 8"),
        (MeshConfig(data=-1, fsdp=3, tensor=1), 8, "8 devices are not divisible by 3"),
        (MeshConfig(data=-1, fsdp=-1, tensor=1), 8, "at most one mesh size may be -1"),
        (MeshConfig(data=0, fsdp=1, tensor=1), 8, "positive or -1"),
        (MeshConfig(data=-1, fsdp=1, tensor=2), 1, "1 devices are not divisible by 2"),
    ],
)
def test_mesh_that_does_not_fit_is_a_clear_error(cfg, devices, message):
    with pytest.raises(MeshError, match=message):
        mesh_shape(cfg, devices)


def test_mesh_on_this_process_uses_all_devices():
    mesh = make_mesh(MeshConfig())
    assert mesh.axis_names == AXES and mesh.devices.size == jax.device_count()
    with pytest.raises(MeshError, match="mesh data=1, fsdp=1, tensor=16 needs 16 devices"):
        make_mesh(MeshConfig(data=1, fsdp=1, tensor=16))


def test_rules_table_maps_each_logical_axis():
    assert dict(RULES) == {
        "batch": ("data", "fsdp"),
        "vocab": "tensor",
        "embed": "fsdp",
        "heads": "tensor",
        "mlp": "tensor",
        "positions": None,
        "relpos_buckets": None,
    }
    table = format_rules()
    assert "| `embed` | fsdp |" in table and "| `batch` | data × fsdp |" in table
    assert "| `positions` | replicated |" in table


def _variants():
    """Every value of every model choice at least once (positions × sharing × activation ×
    norm, the product over positions and sharing, the others cycled along)."""
    from seq2seq.config import MODEL_CHOICES

    out = []
    for i, positions in enumerate(MODEL_CHOICES["positions"]):
        for j, share in enumerate(MODEL_CHOICES["share_embeddings"]):
            k = i * len(MODEL_CHOICES["share_embeddings"]) + j
            out.append(
                dict(
                    positions=positions,
                    share_embeddings=share,
                    activation=MODEL_CHOICES["activation"][k % 4],
                    norm=MODEL_CHOICES["norm"][k % 2],
                    dtype=MODEL_CHOICES["dtype"][k % 2],
                )
            )
    return out


@pytest.mark.parametrize("variant", _variants(), ids=lambda v: "-".join(v.values()))
def test_every_logical_axis_of_every_model_variant_has_a_rule(variant):
    """Each parameter (and Adam moment) of each variant maps to mesh axes on a (2,2,2) mesh;
    before the `positions` and `relpos_buckets` rules, learned and relative positions raised
    KeyError in seq2seq-train."""
    from flax import nnx

    _, abstract = abstract_train_state(Config(model=tiny_config(**variant)))
    names = {
        n
        for spec in jax.tree.leaves(
            nnx.get_partition_spec(abstract), is_leaf=lambda x: isinstance(x, P)
        )
        for n in spec
        if n is not None
    }
    assert {"vocab", "embed", "heads", "mlp"} <= names
    assert names <= set(dict(RULES)), names - set(dict(RULES))
    specs = Partitioner(_mesh(2, 2, 2)).shardings(abstract)  # raises KeyError without a rule
    assert jax.tree.structure(specs) == jax.tree.structure(abstract)


@pytest.mark.parametrize(
    "logical, shape, mesh, expected",
    [
        (P("embed", "mlp"), (32, 64), (2, 2, 2), P("fsdp", "tensor")),  # FFN W1
        (P("mlp", "embed"), (64, 32), (2, 2, 2), P("tensor", "fsdp")),  # FFN W2
        (P("vocab", "embed"), (40, 32), (1, 1, 8), P("tensor")),  # vocab-parallel
        (P("embed", "heads"), (32, 32), (8, 1, 1), P()),  # data only: replicated
        (
            P(
                "embed",
            ),
            (32,),
            (2, 4, 1),
            P("fsdp"),
        ),  # LayerNorm scale
        (
            P(
                "heads",
            ),
            (32,),
            (2, 4, 1),
            P(),
        ),  # tensor=1
        (P("vocab", "embed"), (41, 32), (1, 2, 4), P(None, "fsdp")),  # 41 % 4: replicated
        (P("batch"), (16, 10), (2, 2, 2), P(("data", "fsdp"))),
        (P(), (), (2, 2, 2), P()),  # scalars
    ],
)
def test_logical_to_mesh(logical, shape, mesh, expected):
    assert logical_to_mesh(logical, shape, _mesh(*mesh)) == expected


def test_a_mesh_axis_is_used_once_per_array():
    rules = (("a", "tensor"), ("b", "tensor"))
    assert logical_to_mesh(P("a", "b"), (8, 8), _mesh(1, 1, 2), rules) == P("tensor")


def test_unknown_logical_axis_is_an_error():
    with pytest.raises(KeyError, match="'kv' has no sharding rule"):
        logical_to_mesh(P("kv"), (8,), _mesh(1, 1, 2))


def test_tensor_parallel_needs_whole_heads_and_ffn_units():
    check_model(tiny_config(num_heads=4, d_ff=64), _mesh(1, 1, 4))
    with pytest.raises(MeshError, match="model.num_heads=4 is not divisible by mesh.tensor=8"):
        check_model(tiny_config(num_heads=4, d_ff=64), _mesh(1, 1, 8))
    with pytest.raises(MeshError, match="model.d_ff=48 is not divisible by mesh.tensor=32"):
        check_model(tiny_config(num_heads=32, d_model=64, d_ff=48), _mesh(1, 1, 32))


def test_train_state_shardings_follow_the_rules():
    """Adam moments are placed like their parameters; step, counts and RNG are replicated."""
    _, abstract = abstract_train_state(Config(model=tiny_config()))
    p = Partitioner(_mesh(2, 2, 2))  # an abstract mesh: specs without devices
    specs = jax.tree.map(lambda s: s.spec, p.shardings(abstract))
    params, adam = specs.params, specs.opt_state[1][0]
    assert specs.step == P() and specs.rng == P() and adam.count == P()
    assert jax.tree.structure(specs) == jax.tree.structure(abstract)
    assert jax.tree.leaves(adam.mu) == jax.tree.leaves(adam.nu) == jax.tree.leaves(params)
    layer = params["encoder_layers"][0]
    assert params["embed"]["embedding"].get_value() == P("tensor", "fsdp")
    assert layer["self_attention"]["query"]["kernel"].get_value() == P("fsdp", "tensor")
    assert layer["self_attention"]["out"]["kernel"].get_value() == P("tensor", "fsdp")
    assert layer["ffn"]["wo"]["kernel"].get_value() == P("tensor", "fsdp")
    assert layer["ffn"]["wi"]["bias"].get_value() == P("tensor")
    assert params["encoder_norm"]["scale"].get_value() == P("fsdp")


def test_shard_batch_on_one_process_takes_all_rows():
    p = Partitioner(make_mesh(MeshConfig()))
    batch = {"src": np.arange(12, dtype=np.int32).reshape(4, 3), "len": np.arange(4)}
    placed = p.shard_batch(batch)
    np.testing.assert_array_equal(p.process_rows(4), [0, 1, 2, 3])
    np.testing.assert_array_equal(np.asarray(placed["src"]), batch["src"])
    assert placed["src"].sharding == p.batch_sharding


def test_place_keeps_values_and_init_state_matches_eager_init():
    from seq2seq.model import build_model
    from seq2seq.training.step import create_train_state, make_optimizer

    config = Config(model=tiny_config())
    _, abstract = abstract_train_state(config)
    p = Partitioner(make_mesh(MeshConfig()))
    tx = make_optimizer(config.train)
    eager = create_train_state(build_model(config.model, 0), tx, 0)[1]
    placed = p.place(jax.tree.map(np.asarray, eager))
    jitted = p.init_state(
        lambda: create_train_state(build_model(config.model, 0), tx, 0)[1], abstract
    )
    for a, b, c in zip(jax.tree.leaves(eager), jax.tree.leaves(placed), jax.tree.leaves(jitted)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), atol=1e-6)


def test_config_sections_and_single_process_is_a_no_op():
    config = load_config(None, ["mesh.fsdp=2", "mesh.tensor=4", "distributed.num_processes=1"])
    assert config.mesh == MeshConfig(data=-1, fsdp=2, tensor=4)
    assert config.distributed.num_processes == 1 and config.distributed.auto is False
    with pytest.raises(ConfigError, match="mesh.tensr"):
        load_config(None, ["mesh.tensr=2"])
    assert initialize_distributed(DistributedConfig()) is False
    assert initialize_distributed(config.distributed) is False
