"""FSDP2's ReduceScatter feedback on the CPU: P ranks simulated by threads in one process,
the lowbit collective replaced by an exact reduce-scatter of a stand-in codec (a
blockwise absmax quantizer; what matters is that the collective and the feedback's
recomputation quantize the same way, as the real kernels do). The stand-in has the
extension's ShardCollective's step and state accessors, and built with "residual" it
applies lowbit's residual rule itself (c = x + e in fp32, frame Q(c), e = c - D(Q(c))),
as lowbit's reduce_scatter does. No extension, no GPU.

What they check: the feedback state's size per mode (shard: the padded shard; residual:
P of them; none: nothing) and stats()'s count of it, the feedback rules against a
reference written out here, FSDP's input left as it came, state_dict() round trips (a
resumed run continues bit-identically, a fresh one does not), and what a load drops."""

import io
import threading

import pytest

torch = pytest.importorskip("torch")

from lowbit_torch import fsdp  # noqa: E402
from lowbit_torch.codec import whole_blocks  # noqa: E402

BLOCK = 128
AVG = torch.distributed.ReduceOp.AVG


def fake_roundtrip(x, bits=4):
    """decode(encode(x)) of a blockwise absmax quantizer at `bits`, in fp32 (a stand-in
    for lowbit's codec: per 128-value block, deterministic, lossy)."""
    v = x.float().reshape(-1, BLOCK)
    levels = 2 ** (bits - 1) - 1
    scale = v.abs().amax(dim=1, keepdim=True) / levels
    q = torch.where(scale > 0, torch.round(v / torch.where(scale > 0, scale, 1)), 0)
    return (q * scale).reshape(-1)


class FakeGroup:
    def __init__(self, rank, world):
        self._rank, self._world = rank, world

    def rank(self):
        return self._rank

    def size(self):
        return self._world


class FakeWorld:
    """The collective of every simulated rank: run() waits for all P inputs, then each
    rank writes its own chunk's average of the P decoded chunks (fp32 sum, rounded once
    to the output's dtype), as lowbit's reduce_scatter does. A handle built with feedback
    "residual" quantizes c = x + e (fp32) and keeps e = c - D(Q(c)) over its max_count
    values; every handle counts its calls in ``step``, settable, as ShardCollective's."""

    def __init__(self, world):
        self.world = world
        self.inputs = {}
        self.barrier = threading.Barrier(world)

    def handle(self, rank, max_count=0, feedback="none"):
        world = self

        class Handle:
            def __init__(self):
                self.step, self.max_count = 0, max_count
                self.e = torch.zeros(max_count) if feedback == "residual" else None

            def run(self, src, dst):
                c = src if self.e is None else src.float() + self.e[:src.numel()]
                world.inputs[rank] = c.clone()
                world.barrier.wait()
                padded = dst.numel()
                acc = torch.zeros(padded)
                for r in range(world.world):
                    acc += fake_roundtrip(world.inputs[r][rank * padded:(rank + 1) * padded])
                dst.copy_((acc / world.world).to(dst.dtype))
                if self.e is not None:
                    self.e[:c.numel()] = c - fake_roundtrip(c)
                self.step += 1
                world.barrier.wait()  # every rank has read the inputs before the next call

            def worker_state(self, count):
                return None if self.e is None else self.e[:count].clone()

            def load_state(self, worker, replicated, step):
                assert replicated.numel() == 0
                if self.e is None:
                    assert worker.numel() == 0
                else:
                    self.e[:worker.numel()] = worker
                self.step = step

        return Handle()


@pytest.fixture
def no_extension(monkeypatch):
    """ReduceScatter with the stand-in codec: no compiled module is touched."""
    monkeypatch.setattr(fsdp.ReduceScatter, "_roundtrip",
                        lambda self, x, step, rank: fake_roundtrip(x, self.bits))
    monkeypatch.setattr(fsdp, "frame_bytes", lambda n, bits, grid: n * bits // 8 + 4 * (n // BLOCK))


def make_ranks(world, **options):
    """P ReduceScatters on one FakeWorld."""
    fw = FakeWorld(world)
    ranks = []
    for r in range(world):
        rs = fsdp.ReduceScatter(**options)
        rs._new_collective = (lambda rr, rs: lambda group, key: fw.handle(
            rr, key[0] * key[1], rs._collective_feedback(key[0])))(r, rs)
        rs._fake_world = fw
        ranks.append(rs)
    return ranks


def run_step(ranks, inputs, dtype=torch.float32):
    """One reduce-scatter on every simulated rank (threads); returns the outputs."""
    world = len(ranks)
    outs = [torch.empty(inputs[r].numel() // world, dtype=dtype) for r in range(world)]
    errors = []

    def call(r):
        try:
            ranks[r](outs[r], inputs[r], FakeGroup(r, world), AVG)
        except BaseException as e:  # noqa: BLE001 - re-raised below, in the test's thread
            errors.append(e)
            ranks[r]._fake_world.barrier.abort()  # the other ranks stop waiting for this one

    threads = [threading.Thread(target=call, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]
    return outs


def inputs_at(step, world, count, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(1000 * seed + step)
    return [(torch.randn(count, generator=g) * (1 + 0.3 * r) + 0.05).to(dtype)
            for r in range(world)]


# ------------------------------------------------------------------------- the size


@pytest.mark.parametrize("world,chunk", [(2, 256), (4, 300), (8, 128)])
def test_the_state_of_each_mode_is_its_analytic_size(world, chunk):
    padded = whole_blocks(chunk)
    assert fsdp.feedback_bytes("none", world, chunk) == 0
    assert fsdp.feedback_bytes("shard", world, chunk) == 4 * padded
    assert fsdp.feedback_bytes("residual", world, chunk) == 4 * world * padded
    assert fsdp.feedback_bytes("shard", 1, chunk) == 0  # one rank quantizes nothing


def test_the_default_is_shard_size_feedback():
    assert fsdp.ReduceScatter().feedback == "shard"


@pytest.mark.parametrize("feedback", ["none", "shard", "residual"])
@pytest.mark.parametrize("world,chunk", [(2, 256), (3, 200), (4, 128)])
def test_stats_count_the_feedback_bytes_held(no_extension, feedback, world, chunk):
    ranks = make_ranks(world, feedback=feedback)
    for step in range(2):
        run_step(ranks, inputs_at(step, world, world * chunk))
    for rs in ranks:
        s = rs.stats()
        assert s["feedback_bytes"] == fsdp.feedback_bytes(feedback, world, chunk)
        assert s["lowbit_calls"] == 2
        assert 0 < s["wire_ratio"] < 1
    if feedback == "shard":  # at most the shard: FSDP's memory saving stays
        assert ranks[0].stats()["feedback_bytes"] <= 4 * whole_blocks(chunk)


def test_one_rank_keeps_no_state_and_its_output_is_its_input(no_extension):
    """One rank's collective copies (nothing is quantized): feedback would only add a
    residual of a quantization that never happened."""
    class Copy:
        step = 0

        def run(self, src, dst):
            dst.copy_(src)
            self.step += 1

    rs = fsdp.ReduceScatter()
    rs._new_collective = lambda group, key: Copy()
    x = inputs_at(0, 1, 384)[0]
    for _ in range(2):
        out = torch.empty(384)
        rs(out, x, FakeGroup(0, 1), AVG)
        assert torch.equal(out, x)
    assert rs.stats()["feedback_bytes"] == 0


# ------------------------------------------------------------------------ the rules


def reference(inputs_per_step, world, feedback):
    """The feedback rules written out: per step, each rank's c = x + e on its own chunk
    (shard) or on all (residual), the average of the decoded chunks, e = c - D(Q(c))."""
    count = inputs_per_step[0][0].numel()
    chunk = count // world
    e = [torch.zeros(count) for _ in range(world)]
    outs = []
    for xs in inputs_per_step:
        sent = []
        for r, x in enumerate(xs):
            c = x.float().clone()
            part = slice(0, count) if feedback == "residual" else slice(r * chunk, (r + 1) * chunk)
            if feedback != "none":
                c[part] += e[r][part]
                d = torch.cat([fake_roundtrip(c[i:i + chunk]) for i in range(0, count, chunk)])
                e[r][part] = (c - d)[part]
            sent.append(c)
        outs.append([sum(fake_roundtrip(s[j * chunk:(j + 1) * chunk]) for s in sent) / world
                     for j in range(world)])
    return outs, e


@pytest.mark.parametrize("feedback", ["none", "shard", "residual"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_outputs_and_state_follow_the_feedback_rule(no_extension, feedback, world):
    chunk = 256
    steps = [inputs_at(s, world, world * chunk) for s in range(4)]
    ranks = make_ranks(world, feedback=feedback)
    got = [run_step(ranks, [x.clone() for x in xs]) for xs in steps]
    want, e = reference(steps, world, feedback)
    for s in range(len(steps)):
        for r in range(world):
            assert torch.equal(got[s][r], want[s][r]), (s, r)
    for r, rs in enumerate(ranks):
        (buf,) = rs._buffers.values()
        if feedback == "none":
            assert buf.state() is None
        elif feedback == "shard":
            assert torch.equal(buf.state(), e[r][r * chunk:(r + 1) * chunk])
            assert buf.state().abs().sum() > 0
        else:  # the collective's own
            assert buf.residual is None and buf.in_collective
            assert torch.equal(buf.state(), e[r])


def test_shard_feedback_shrinks_the_accumulated_error_of_the_own_chunk(no_extension):
    """The same gradient every step: without feedback the quantization error of every step
    adds up; with the shard's feedback the own chunk's share telescopes. At P = 2 half the
    error terms are the owners': the summed output's error drops."""
    world, chunk, steps = 2, 512, 40
    xs = inputs_at(0, world, world * chunk)
    mean = torch.stack([x.float() for x in xs]).mean(0)
    err = {}
    for feedback in ("none", "shard", "residual"):
        ranks = make_ranks(world, feedback=feedback)
        total = torch.zeros(world * chunk)
        for _ in range(steps):
            total += torch.cat(run_step(ranks, [x.clone() for x in xs]))
        err[feedback] = (total - steps * mean).norm().item()
    assert err["residual"] < err["shard"] < 0.8 * err["none"], err


@pytest.mark.parametrize("feedback", ["shard", "residual"])
@pytest.mark.parametrize("chunk", [256, 200])  # a whole number of blocks, and staged
def test_fsdps_input_is_left_as_it_came(no_extension, feedback, chunk):
    world = 2
    ranks = make_ranks(world, feedback=feedback)
    xs = inputs_at(0, world, world * chunk)
    kept = [x.clone() for x in xs]
    for _ in range(2):
        run_step(ranks, xs)
    for x, k in zip(xs, kept):
        assert torch.equal(x, k)


def test_bfloat16_feedback_is_taken_against_the_values_sent(no_extension):
    world, chunk = 2, 256
    ranks = make_ranks(world, feedback="shard")
    xs = inputs_at(0, world, world * chunk, torch.bfloat16)
    run_step(ranks, xs, torch.bfloat16)
    r = 0
    own = xs[r][:chunk].float()
    want = own - fake_roundtrip(own.to(torch.bfloat16))  # e was 0: c = x
    (buf,) = ranks[r]._buffers.values()
    assert buf.residual.dtype == torch.float32
    assert torch.equal(buf.residual, want)


def test_residual_feedback_is_the_collectives_rule_in_fp32(no_extension):
    """"residual" is lowbit's reduce_scatter's own rule: the collective quantizes
    c = x + e in fp32, not c rounded to the gradient's dtype as "shard" sends it, and
    keeps e = c - D(Q(c)) over the whole padded buffer; nothing of it is in torch."""
    world, chunk = 2, 200
    padded = whole_blocks(chunk)
    ranks = make_ranks(world, feedback="residual")
    steps = [inputs_at(s, world, world * chunk, torch.bfloat16) for s in range(2)]
    for xs in steps:
        run_step(ranks, [x.clone() for x in xs], torch.bfloat16)
    r = 0
    e = torch.zeros(world * padded)
    for xs in steps:
        x = torch.zeros(world, padded)
        x[:, :chunk] = xs[r].float().view(world, chunk)
        c = x.view(-1) + e
        e = c - fake_roundtrip(c)
    (buf,) = ranks[r]._buffers.values()
    assert buf.residual is None and buf.in_collective
    assert torch.equal(buf.state(), e)
    assert ranks[r].stats()["feedback_bytes"] == 4 * world * padded


def test_shard_feedback_refuses_stochastic_rounding():
    with pytest.raises(ValueError, match="nearest"):
        fsdp.ReduceScatter(feedback="shard", rounding="stochastic")
    with pytest.raises(ValueError, match="feedback must be one of"):
        fsdp.ReduceScatter(feedback="ef21")


# ----------------------------------------------------------------------- state_dict


def saved_and_resumed(world, chunk, feedback, load=True, mutate=None):
    """Three steps, every rank's state_dict() through torch.save, two more steps; then
    fresh ReduceScatters (loaded, or not) run the same two steps. Returns both runs' last
    two steps' outputs and the fresh ranks."""
    steps = [inputs_at(s, world, world * chunk, seed=3) for s in range(5)]
    ranks = make_ranks(world, feedback=feedback)
    for xs in steps[:3]:
        run_step(ranks, [x.clone() for x in xs])
    saved = []
    for rs in ranks:
        f = io.BytesIO()
        torch.save(rs.state_dict(), f)
        f.seek(0)
        saved.append(torch.load(f))
    straight = [run_step(ranks, [x.clone() for x in xs]) for xs in steps[3:]]
    fresh = make_ranks(world, feedback=feedback)
    for r, rs in enumerate(fresh):
        state = saved[r] if mutate is None else mutate(r, saved[r])
        if load:
            rs.load_state_dict(state)
    resumed = [run_step(fresh, [x.clone() for x in xs]) for xs in steps[3:]]
    return straight, resumed, fresh, saved


def same(a, b):
    return all(torch.equal(x, y) for sa, sb in zip(a, b) for x, y in zip(sa, sb))


@pytest.mark.parametrize("feedback", ["shard", "residual"])
@pytest.mark.parametrize("world,chunk", [(2, 256), (4, 200)])
def test_a_resume_continues_bit_identically(no_extension, feedback, world, chunk):
    straight, resumed, fresh, saved = saved_and_resumed(world, chunk, feedback)
    assert same(straight, resumed)
    for r, rs in enumerate(fresh):
        s = rs.stats()
        assert s["feedback_loaded"] == 1 and s.get("feedback_dropped_on_load", 0) == 0
        (buf,) = rs._buffers.values()
        assert buf.step == 5  # three before the save, two after
    (b,) = saved[0]["buffers"]
    assert b["residual"].device.type == "cpu" and b["step"] == 3
    assert b["residual"].numel() == fsdp.feedback_numel(feedback, world, chunk)
    # Without the checkpoint's feedback the result differs: the state mattered.
    _, unloaded, _, _ = saved_and_resumed(world, chunk, feedback, load=False)
    assert not same(straight, unloaded)


@pytest.mark.parametrize("feedback", ["none", "shard", "residual"])
def test_a_resume_sets_the_collectives_step_and_state_without_a_warning(no_extension, feedback):
    """The step goes back into each buffer's collective (stochastic rounding's key, so a
    resume with stochastic rounding is bit-identical too) and "residual"'s state into the
    collective's own feedback state; state_dict() reads both from the collective."""
    import warnings

    world, chunk = 2, 256
    rounding = "nearest" if feedback == "shard" else "stochastic"
    steps = [inputs_at(s, world, world * chunk) for s in range(4)]
    ranks = make_ranks(world, feedback=feedback, rounding=rounding)
    for xs in steps[:3]:
        run_step(ranks, [x.clone() for x in xs])
    saved = [rs.state_dict() for rs in ranks]
    for rs, st in zip(ranks, saved):
        (b,) = st["buffers"]
        (buf,) = rs._buffers.values()
        assert b["step"] == buf.handle.step == 3
        if feedback == "residual":
            assert torch.equal(b["residual"], buf.handle.e)
    fresh = make_ranks(world, feedback=feedback, rounding=rounding)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for rs, st in zip(fresh, saved):
            rs.load_state_dict(st)
    resumed = run_step(fresh, [x.clone() for x in steps[3]])
    straight = run_step(ranks, [x.clone() for x in steps[3]])
    assert same([straight], [resumed])
    for a, b in zip(ranks, fresh):
        (ba,), (bb,) = a._buffers.values(), b._buffers.values()
        assert ba.handle.step == bb.handle.step == bb.step == 4
        if feedback != "none":
            assert torch.equal(ba.state(), bb.state())


def test_a_state_saved_under_other_parameter_shapes_is_dropped(no_extension):
    def other_layout(r, s):
        return dict(s, layout=[(7, 3)])

    world, chunk = 2, 256
    steps = [inputs_at(s, world, world * chunk) for s in range(2)]
    ranks = make_ranks(world)
    for rs in ranks:
        rs.layout = [(16, 32)]
    run_step(ranks, steps[0])
    states = [rs.state_dict() for rs in ranks]
    fresh = make_ranks(world)
    for r, rs in enumerate(fresh):
        rs.layout = [(16, 32)]
        rs.load_state_dict(other_layout(r, states[r]))
    run_step(fresh, steps[1])
    for rs in fresh:
        s = rs.stats()
        assert s["feedback_dropped_on_load"] == 1 and s.get("feedback_loaded", 0) == 0
        (buf,) = rs._buffers.values()
        assert buf.step == 1  # started afresh


def test_a_state_for_another_shape_or_rank_is_dropped_at_the_first_call(no_extension):
    world = 2
    # saved at chunk 256, resumed at 384: another buffer shape
    _, _, fresh, _ = saved_and_resumed(world, 256, "shard")
    states = [rs.state_dict() for rs in fresh]
    other = make_ranks(world)
    for r, rs in enumerate(other):
        rs.load_state_dict(states[r])
    run_step(other, inputs_at(0, world, world * 384))
    assert all(rs.stats()["feedback_dropped_on_load"] == 1 for rs in other)
    assert all(rs.stats()["feedback_bytes"] == 4 * 384 for rs in other)
    # every rank handed another rank's state
    swapped = make_ranks(world)
    for r, rs in enumerate(swapped):
        rs.load_state_dict(states[world - 1 - r])
    run_step(swapped, inputs_at(0, world, world * 256))
    for rs in swapped:
        assert rs.stats()["feedback_dropped_on_load"] == 1
        (buf,) = rs._buffers.values()
        assert buf.step == 1


def test_a_state_saved_again_before_the_first_call_keeps_what_was_loaded(no_extension):
    _, _, fresh, saved = saved_and_resumed(2, 256, "shard")
    again = make_ranks(2)
    again[0].load_state_dict(saved[0])
    (b,) = again[0].state_dict()["buffers"]
    (want,) = saved[0]["buffers"]
    assert b["step"] == want["step"] and torch.equal(b["residual"], want["residual"])


@pytest.mark.parametrize("option,value", [("bits", 8), ("feedback", "residual"), ("seed", 1),
                                          ("grid", "full")])
def test_a_state_saved_under_other_options_raises(option, value):
    state = fsdp.ReduceScatter().state_dict()
    other = fsdp.ReduceScatter(**{option: value})
    with pytest.raises(ValueError, match=option):
        other.load_state_dict(state)


def test_a_state_that_is_not_a_reduce_scatters_raises():
    with pytest.raises(ValueError, match="not a ReduceScatter"):
        fsdp.ReduceScatter().load_state_dict({"version": 1, "buckets": {}})


def test_loading_after_the_first_call_raises(no_extension):
    ranks = make_ranks(2)
    run_step(ranks, inputs_at(0, 2, 512))
    with pytest.raises(RuntimeError, match="before the first call"):
        ranks[0].load_state_dict(fsdp.ReduceScatter().state_dict())


def test_the_model_helpers_save_and_load_by_module_name():
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    for i, m in enumerate(net):
        m._lowbit_reduce_scatter = fsdp.ReduceScatter(seed=i)
    state = fsdp.fsdp_state_dict(net)
    assert set(state) == {"0", "1"} and state["1"]["seed"] == 1
    other = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    for i, m in enumerate(other):
        m._lowbit_reduce_scatter = fsdp.ReduceScatter(seed=i)
    fsdp.load_fsdp_state_dict(other, state)
    with pytest.raises(ValueError, match="'2'"):
        fsdp.load_fsdp_state_dict(other, dict(state, **{"2": state["0"]}))
