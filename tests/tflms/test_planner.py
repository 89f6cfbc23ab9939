"""Plan: hand-derived swaps and triggers on tiny graphs, every rule and option."""

import pytest
import tensorflow as tf

from tests.tflms.graphs import WIDTH, chain_with_skip, diamond, fan_out, long_chain
from tflms import LMSConfig, Swap, SwapIn, SwapPlan, build_view, make_plan


def plan_of(graph, **options):
    options.setdefault("min_tensor_bytes", "32KiB")  # the test tensors are 32 KiB and up
    options.setdefault("swapin_groupby", 5)
    config = LMSConfig(**options)
    return make_plan(build_view(graph, config=config), config)


def test_chain_with_skip_swaps_the_long_lived_tensor_only():
    # h1 is at level 2, its far consumer `out` at level 13: distance 11.
    plan = plan_of(chain_with_skip(n=12), swapout_threshold=10, swapin_ahead=4)
    assert [s.tensor for s in plan.swaps] == ["h1:0"]
    swap = plan.swaps[0]
    assert (swap.producer, swap.index, swap.producer_level, swap.bytes) == (
        "h1",
        0,
        2,
        8 * WIDTH * 4,
    )
    (swap_in,) = swap.swap_ins
    assert swap_in.consumers == (("out", 1),)
    # Walking back from `out` along deepest inputs: h11 (12), h10 (11), h9 (10), h8 (9) = 13 - 4.
    assert (swap_in.trigger, swap_in.trigger_level, swap_in.consumer_level) == ("h8", 9, 13)
    assert swap_in.fallback is None and swap_in.control_inputs == ()


@pytest.mark.parametrize("threshold, swapped", [(10, True), (11, False)])
def test_threshold_is_strict(threshold, swapped):
    plan = plan_of(chain_with_skip(n=12), swapout_threshold=threshold)
    assert bool(plan.swaps) is swapped


@pytest.mark.parametrize(
    "ahead, trigger", [(1, "h11"), (2, "h10"), (10, "h2"), (11, "h2"), (40, "h2")]
)
def test_trigger_sits_ahead_levels_before_the_consumer(ahead, trigger):
    # A trigger must come after the producer (level 2): from ahead=11 on, the
    # target level is at or below it, so the op just above the producer wins.
    plan = plan_of(chain_with_skip(n=12), swapout_threshold=5, swapin_ahead=ahead)
    assert plan.swaps[0].swap_ins[0].trigger == trigger


def test_diamond_trigger_comes_from_the_deepest_path():
    plan = plan_of(diamond(), swapout_threshold=10, swapin_ahead=3)
    (swap,) = plan.swaps
    assert swap.tensor == "a:0" and swap.swap_ins[0].consumers == (("end", 1),)
    assert swap.swap_ins[0].trigger == "t7"  # end is at level 14, t7 at 11


def test_consumers_close_in_level_share_a_swap_in():
    # tap8 (L10), tap10 (L12), tap20 (L22) all read h1 (L2); h_k sits at level k + 1.
    plan = plan_of(fan_out(), swapout_threshold=5, swapin_groupby=5, swapin_ahead=2)
    (swap,) = [s for s in plan.swaps if s.tensor == "h1:0"]
    assert [si.consumers for si in swap.swap_ins] == [(("tap8", 1), ("tap10", 1)), (("tap20", 1),)]
    assert [si.trigger for si in swap.swap_ins] == ["h7", "h19"]  # levels 10 - 2, 22 - 2
    assert swap.swapin_name(0) == "h1-lms/swapin" and swap.swapin_name(1) == "h1-lms/swapin_1"
    plan = plan_of(fan_out(), swapout_threshold=5, swapin_groupby=0)
    assert len(plan.swaps[0].swap_ins) == 3


def test_sync_mode_1_makes_near_consumers_wait_for_the_swap_out():
    plan = plan_of(chain_with_skip(n=12), swapout_threshold=10, sync_mode=1)
    assert plan.swaps[0].wait_for_swapout == ("h2",)


@pytest.mark.parametrize("mode", [2, 3])
def test_sync_mode_2_waits_for_the_consumers_other_inputs(mode):
    plan = plan_of(chain_with_skip(n=12), swapout_threshold=10, sync_mode=mode)
    (swap_in,) = plan.swaps[0].swap_ins
    assert swap_in.trigger is None and swap_in.control_inputs == ("h11",)
    assert plan.swaps[0].wait_for_swapout == (("h2",) if mode == 3 else ())


def test_serialization_chains_the_ops_of_the_listed_levels():
    plan = plan_of(diamond(), swapout_threshold=100, serialization=["2"])
    assert plan.swaps == () and plan.serialization == (("b", "c"),)


def test_scope_and_type_filters():
    g = chain_with_skip(n=12)
    assert plan_of(g, swapout_threshold=5, excl_scopes=["h1"]).swaps == ()
    assert plan_of(g, swapout_threshold=5, incl_scopes=["h"]).swaps
    assert plan_of(g, swapout_threshold=5, incl_types=["Sigmoid"]).swaps == ()
    assert plan_of(g, swapout_threshold=5, excl_types=["LeakyRelu"]).swaps == ()


def test_n_tensors_keeps_the_largest():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, WIDTH], name="x")
        small = tf.nn.relu(x, name="small")
        big = tf.nn.relu(tf.concat([x, x], axis=1), name="big")
        end = long_chain(tf.concat([small, small], axis=1) + big, 12, "t")
        tf.add(end, big, name="out1")
        tf.add(end[:, :WIDTH], small, name="out2")
    plan = plan_of(g, swapout_threshold=5)
    assert [s.tensor for s in plan.swaps] == ["big:0", "small:0"]
    capped = plan_of(g, swapout_threshold=5, n_tensors=1)
    assert [s.tensor for s in capped.swaps] == ["big:0"]
    assert ("small:0", "over the n_tensors cap") in capped.skipped


def test_never_swap_rules():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, WIDTH], name="x")
        as_int = tf.cast(x, tf.int32, name="as_int")  # int32: host memory on GPUs
        vector = tf.reduce_sum(x, axis=1, name="vector")  # rank 1
        tiny = tf.nn.relu(x[:1], name="tiny")  # 4 KiB < 32 KiB
        with tf.device("/device:CPU:0"):
            on_host = tf.nn.relu(x, name="on_host")
        const = tf.constant(1.0, shape=[64, WIDTH], name="const")
        end = long_chain(x, 15, "t")
        tf.concat(
            [end, tf.cast(as_int, tf.float32), on_host, const, tf.tile(tiny, [64, 1])]
            + [tf.expand_dims(vector, 1) * tf.ones([1, WIDTH])],
            axis=1,
            name="sink",
        )
    plan = plan_of(g, swapout_threshold=3, device="/device:GPU:0")
    swapped = {s.producer for s in plan.swaps}
    assert "Tile" in swapped  # an ordinary float activation with a far consumer
    assert not swapped & {"as_int", "vector", "tiny", "on_host", "const", "x"}


def test_no_trigger_falls_back_to_waiting_for_the_consumers_other_inputs(devices):
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, WIDTH], name="x")
        a = tf.nn.relu(x, name="a")
        with tf.device(devices.host):  # nothing on the compute device between a and out
            h = long_chain(a, 12, "host")
        tf.add(h, a, name="out")
    plan = plan_of(g, swapout_threshold=5, device=devices.compute)
    (swap_in,) = plan.swaps[0].swap_ins
    assert swap_in.trigger is None and swap_in.control_inputs == ("host11",)
    assert "no op on the compute device" in swap_in.fallback
    assert "synchronous" in plan.summary()


def test_no_trigger_and_no_other_input_skips_the_tensor(devices):
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, WIDTH], name="x")
        a = tf.nn.relu(x, name="a")
        with tf.device(devices.host):
            h = long_chain(a, 12, "host")
        with tf.control_dependencies([h]):
            tf.nn.relu(a, name="out")
    plan = plan_of(g, swapout_threshold=5, device=devices.compute)
    assert plan.swaps == ()
    assert (
        "a:0",
        "no swap-in trigger and the consumer has no other input to wait for",
    ) in plan.skipped


def test_tensors_an_addn_of_three_or_more_reads_or_writes_are_not_swapped():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, WIDTH], name="x")
        p = tf.nn.relu(x, name="p")
        total = tf.add_n([p, tf.nn.relu(x, name="r"), long_chain(x, 12, "q")], name="sum3")
        end = long_chain(total, 12, "t")
        tf.add(end, total, name="uses_sum")  # sum3 itself lives long
        tf.add_n([p, long_chain(x, 14, "s")], name="sum2")  # two inputs: order cannot matter
        tf.add(long_chain(x, 16, "u"), tf.nn.relu(x, name="v"), name="uses_v")
    plan = plan_of(g, swapout_threshold=5)
    reasons = dict(plan.skipped)
    assert "AddN of 3+ inputs" in reasons["p:0"] and "AddN of 3+ inputs" in reasons["sum3:0"]
    assert "v:0" in {s.tensor for s in plan.swaps}


def test_secondary_outputs_are_not_rerouted_into_commutative_ops():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 2 * WIDTH], name="x")
        halves = tf.split(x, 2, axis=1, name="split")
        end = long_chain(halves[0], 12, "t")
        tf.add(end, halves[1], name="added")
        tf.nn.relu(tf.identity(end) * 0 + tf.nn.relu(halves[1], name="late_relu"), name="z")
    plan = plan_of(g, swapout_threshold=5)
    reasons = dict(plan.skipped)
    assert "commutative" in reasons.get("split:1", "")
    g2 = tf.Graph()
    with g2.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 2 * WIDTH], name="x")
        halves = tf.split(x, 2, axis=1, name="split")
        end = long_chain(halves[0], 12, "t")
        tf.concat([end, tf.nn.relu(halves[1], name="late")], axis=1, name="joined")
    # `late` is created last, but only one level above split: not far. Force distance:
    plan2 = plan_of(g2, swapout_threshold=0)
    # concat is not commutative, so split:1 is a candidate; its consumer `late` has no other
    # input to wait for and no op can trigger its swap-in: kept, and the reason says so.
    assert "split:1" not in {s.tensor for s in plan2.swaps}
    assert "no swap-in trigger" in dict(plan2.skipped)["split:1"]
    # a secondary output's swap ops are named after the output they carry
    secondary = Swap("split:1", "split", 1, 4096, "float32", 1, "", (SwapIn((("late", 0),)),))
    assert secondary.swapin_name(0) == "split-lms/swapin_out1"


@pytest.mark.parametrize("device, swapped", [("/device:CPU:1", False), ("/device:GPU:0", True)])
def test_maxpool_gradient_pairing_is_kept_on_cpu_only(device, swapped):
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 32, 32, 16], name="x")
        pooled = tf.nn.max_pool2d(tf.nn.relu(x), 2, 2, "VALID", name="pool")
        loss = tf.reduce_sum(long_chain(pooled, 12, "t"))
        tf.gradients(loss, x)
    plan = plan_of(g, swapout_threshold=5, device=device)
    assert ("pool:0" in {s.tensor for s in plan.swaps}) is swapped
    if not swapped:
        assert "oneDNN" in dict(plan.skipped)["pool:0"]


def test_graph_without_candidates_gives_an_empty_plan_with_reasons():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="x")
        tf.nn.relu(x, name="y")
    plan = plan_of(g)
    assert plan.swaps == () and "0 tensors swapped" in plan.summary()


def test_plan_round_trips_through_json():
    plan = plan_of(fan_out(), swapout_threshold=5, sync_mode=3, serialization=["2:3"])
    assert SwapPlan.from_json(plan.to_json()) == plan
    assert SwapPlan.from_json(plan.to_json()).config == plan.config


def test_planning_is_deterministic():
    a = plan_of(fan_out(), swapout_threshold=5).to_json()
    b = plan_of(fan_out(), swapout_threshold=5).to_json()
    assert a == b


def test_links_inside_an_arithmetic_chain_are_not_swapped():
    # A residual block: the shortcut's y = x*s + b (AddV2) waits for the main branch,
    # then out = y + main (AddV2). Grappler folds that Add tree only if y has one
    # consumer, so a swap-out on y would change the float rounding.
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, WIDTH], name="x")
        shortcut = tf.add(x * 2.0, 1.0, name="shortcut")
        main = long_chain(x, 12, "m")
        tf.add(shortcut, main, name="residual")
        relu_out = tf.nn.relu(x * 3.0, name="relu_out")
        tf.add(relu_out, long_chain(x, 14, "n"), name="residual2")
    plan = plan_of(g, swapout_threshold=5)
    assert "arithmetic optimizer" in dict(plan.skipped)["shortcut:0"]
    assert "relu_out:0" in {s.tensor for s in plan.swaps}  # a Relu is not folded into the Add tree


def test_a_plan_without_swaps_says_why_and_which_option_would_change_it():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 2 * WIDTH], name="x")
        first = tf.nn.relu(x, name="first")
        end = long_chain(first, 6, "t")
        tf.add(end, first, name="out")  # `first` is read 7 levels later
    small = plan_of(g, min_tensor_bytes="1MiB")
    assert not small.swaps
    assert any("under min_tensor_bytes=1.00 MiB" in n and "64.00 KiB" in n for n in small.notes)
    short = plan_of(g, swapout_threshold=20)
    assert not short.swaps
    (note,) = [n for n in short.notes if n.startswith("no tensor swapped")]
    assert "within swapout_threshold=20 levels (the longest-lived spans 7" in note
    assert plan_of(g, swapout_threshold=3).swaps  # and the option it names does change it
