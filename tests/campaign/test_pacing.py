"""How far the compiles run ahead of the GPUs (pacing.Pacer), the start-up batch sizes, and the hang limit."""
from tuner.campaign.pacing import HANG_FLOOR_S, Pacer, batch_size


def test_before_any_measurement_the_floor_and_the_compile_slots_are_filled():
    p = Pacer(n_gpus=1, gpu_slots=4, compile_slots=12)
    assert p.target() == 2 * 4 + 12
    assert p.room(in_compile=0, ready=0) == 20 and p.room(in_compile=15, ready=3) == 2


def test_then_littles_law_sets_the_lookahead_counting_the_kernels_waiting():
    p = Pacer(n_gpus=1, gpu_slots=4, compile_slots=12)
    p.note_compile(26.0)          # a batch of 4 Hopper kernels
    p.note_trial(1.6)             # one trial's hold of the GPU
    assert p.target() == 21       # 1.25 x (1 / 1.6 s) x 26 s, rounded up
    assert p.room(in_compile=10, ready=5) == 6
    assert p.room(in_compile=0, ready=8) == 13         # kernels waiting count against the target, no cap of their own
    assert p.room(in_compile=0, ready=21) == 0 and p.room(in_compile=4, ready=20) < 0
    fast = Pacer(n_gpus=1, gpu_slots=4)
    fast.note_compile(1.0)
    fast.note_trial(1.0)
    assert fast.target() == 8                           # never below 2 x the GPU slots


def test_near_the_deadline_no_more_is_compiled_than_the_gpus_can_still_measure():
    p = Pacer(n_gpus=1, gpu_slots=4, compile_slots=12)
    p.note_compile(20.0)
    p.note_trial(2.0)
    assert p.room(0, 0, seconds_left=600) == p.target()
    assert p.room(0, 0, seconds_left=30) == 5           # (30 - 20) / 2 trials fit after compiling
    assert p.room(2, 3, seconds_left=30) == 0
    assert p.room(0, 0, seconds_left=10) < 0


def test_a_trial_is_taken_for_hung_at_ten_typical_holds_with_a_floor():
    p = Pacer(n_gpus=1, gpu_slots=4)
    assert p.trial_limit(300.0) == 300.0                # nothing known yet: the user's --trial-timeout
    p.note_trial(1.5)
    assert p.trial_limit(300.0) == HANG_FLOOR_S
    for _ in range(20):
        p.note_trial(6.0)
    assert 55.0 < p.trial_limit(300.0) <= 60.0
    assert p.trial_limit(30.0) == 30.0                  # never past --trial-timeout


def test_start_up_batches_are_small_then_full():
    sizes = [batch_size(8, sent, n_gpus=1, compile_slots=12) for sent in range(14)]
    assert sizes == [1] * 4 + [2] * 4 + [4] * 4 + [8, 8]
    assert [batch_size(2, sent, n_gpus=1, compile_slots=3) for sent in range(4)] == [1, 2, 2, 2]
    assert batch_size(8, 0, n_gpus=0, compile_slots=12) == 8   # a dry run has no GPU to wait


def test_a_batch_mixing_hopper_and_sm80_class_sketches_compiles_as_one_task_per_unit():
    # nvcc would build the two preambles as two units one after the other in one task (translate/nvcc.py)
    import tl
    import translate
    from hardware_profiles import load_profile
    from translate.defaults import default_params
    from kernel_abi.spec import KernelSpec
    from tuner.campaign.state import Candidate
    from tuner.campaign.pacing import one_unit_each

    h100, spec = load_profile("h100"), KernelSpec("mha", 128, 128, True, "bf16")

    def candidate(schedule: str, params_schedule: str, block_n: int) -> Candidate:
        from translate.params import KernelParams

        params = KernelParams.from_dict({**default_params(h100, spec, params_schedule).to_dict(), "block_n": block_n})
        kernel = translate.generate(tl.parse_program(tl.load_sketch("mha", True, schedule)), params, h100, spec)
        return Candidate(camp=None, trial=None, params=params, schedule=schedule, key=kernel.name, kernel=kernel)

    ws_a, fa2, ws_b, ws_c = (candidate("ws_overlap", "ws_overlap", 128), candidate("fa2", "fa2", 64),
                             candidate("ws_serial", "ws_overlap", 176), candidate("ws_overlap", "ws_overlap", 112))
    assert fa2.kernel.preamble != ws_a.kernel.preamble
    assert one_unit_each([ws_a, fa2, ws_b, ws_c]) == [[ws_a, ws_b, ws_c], [fa2]]   # ask order kept in each
    replay = [Candidate(camp=None, trial=None, params=ws_a.params, schedule="fa2", key=str(i)) for i in range(3)]
    assert one_unit_each(replay) == [replay]    # the replay backend compiles nothing: one task


def test_a_unit_is_filled_past_the_target_since_a_lone_kernel_costs_three_times_the_cpu():
    from tuner.campaign.pacing import unit_size

    assert unit_size(room=1, end_room=50, planned=4) == 4     # the GPUs need one: a full unit is built
    assert unit_size(room=0, end_room=50, planned=4) == 0     # they need none: nothing
    assert unit_size(room=6, end_room=2, planned=4) == 2      # the budget's end: what can still be measured
    assert unit_size(room=3, end_room=0, planned=4) == 0
    assert unit_size(room=9, end_room=9, planned=1) == 1      # ramp-up units stay small


def test_one_kernel_short_of_the_pacers_target_a_full_unit_is_built():
    from tuner.campaign.pacing import Pacer, unit_size

    p = Pacer(n_gpus=1, gpu_slots=4, compile_slots=16)
    p.note_compile(20.0)
    p.note_trial(1.0)
    in_compile = p.target() - 1
    assert p.room(in_compile, 0) == 1
    assert unit_size(p.room(in_compile, 0), p.room(in_compile, 0, seconds_left=600), 4) == 4


def _gpu_busy_share(pacer: Pacer, slots: int = 12, unit: int = 8, compile_s: float = 35.0, trial_s: float = 0.9,
                    seconds: float = 900.0, settle: float = 200.0) -> float:
    """The campaign loop's pacing in a discrete-time model (0.1-s steps): a unit takes ``compile_s`` whatever
    its size, one GPU measures one kernel per ``trial_s``; the GPU's busy share after ``settle`` seconds."""
    from tuner.campaign.pacing import unit_size

    dt, t = 0.1, 0.0
    compiling: list[tuple[float, int]] = []        # (done at, kernels)
    ready, gpu_free_at, busy = 0, 0.0, 0.0
    while t < seconds:
        for done in [c for c in compiling if c[0] <= t]:
            compiling.remove(done)
            ready += done[1]
            pacer.note_compile(compile_s)
        while len(compiling) < slots:
            in_compile = sum(k for _, k in compiling)
            size = unit_size(pacer.room(in_compile, ready), pacer.room(in_compile, ready, None), unit)
            if size <= 0:
                break
            compiling.append((t + compile_s, size))
        if ready and gpu_free_at <= t:
            ready -= 1
            gpu_free_at = t + trial_s
            pacer.note_trial(trial_s)
            if t >= settle:
                busy += min(trial_s, seconds - t)
        t += dt
    return busy / (seconds - settle)


def test_compiles_flow_without_waves_when_the_cpus_could_feed_the_gpu():
    # 12 slots of 8-kernel units every 35 s could build 2.7 kernels/s against the GPU's 1.2/s: the pacer
    # must keep the GPU busy. A cap of 2 x the GPU slots on the kernels waiting (the pacer before
    # 2026-11-25) made the units start and end together in waves, and the GPU waited between them.
    assert _gpu_busy_share(Pacer(n_gpus=1, gpu_slots=4, compile_slots=12)) > 0.97

    class CappedReady(Pacer):
        def room(self, in_compile, ready, seconds_left=None):
            return 0 if ready >= 2 * self.gpu_slots else super().room(in_compile, ready, seconds_left)

    assert _gpu_busy_share(CappedReady(n_gpus=1, gpu_slots=4, compile_slots=12)) < 0.85


def test_before_any_measurement_the_first_round_of_units_is_asked_in_full():
    from tuner.campaign.pacing import first_round

    assert first_round(8, n_gpus=1, compile_slots=12) == 4 * 1 + 4 * 2 + 4 * 4
    p = Pacer(n_gpus=1, gpu_slots=4, compile_slots=12, first_round=first_round(8, 1, 12))
    assert p.room(in_compile=0, ready=0) == 2 * 4 + 28
