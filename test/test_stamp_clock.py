"""Camera and joint-state clocks (stamp_clock.py through InputBuffer): steps, glitches, drift and stalls.

A simulated stream (no ROS, simulated time): two cameras at 20 Hz and joint states at 50 Hz, delivered a few ms
after capture, ticks at 10 Hz. One input's stamps are moved against the truth as each case says. Every tick
checks what a user relies on:
- every frame an observation uses is timed between its true capture and its receipt (never from an estimate
  a jump made stale: that would make a fresh frame look seconds old, or an old one fresh);
- while the stamps are bad for good, the node still observes (another clock: timed by receipt) after the
  jump has held, and once they are good again it observes within CONFIRM_SEC and two ticks;
- jumps and outliers are counted per input, in the direction they went.
"""
from dataclasses import replace
from types import SimpleNamespace

import pytest

from vla_policy_node.observation import (InputBuffer, InputKind, InputLayout, InputTopic, SkipTick, TimingLimits,
                                         JOINT_STATES)
from vla_policy_node.stamp_clock import CONFIRM_SEC, DELAY_WINDOW, StampClock

NS = 1_000_000_000
MS = 1_000_000
START = 1000 * NS
CAMERAS = ('base_0_rgb', 'wrist_0_rgb')
TOPICS = tuple(f'/cameras/{c}/image_raw' for c in CAMERAS)
JOINTS = ('j1', 'j2')
LAYOUT = InputLayout(cameras=tuple(InputTopic(t, InputKind.CAMERA, camera=c) for c, t in zip(CAMERAS, TOPICS)),
                     joint_states=InputTopic('/joint_states', InputKind.JOINT_STATE),
                     instruction=InputTopic('/instruction', InputKind.INSTRUCTION), state_joint_names=JOINTS)
LIMITS = TimingLimits(max_image_age_sec=0.5, max_camera_skew_sec=0.1, max_joint_state_age_sec=0.5,
                      default_instruction='pick it up')
CAMERA_PERIOD, JOINT_PERIOD, TICK_PERIOD = 50 * MS, 20 * MS, 100 * MS
BAD_FROM, GOOD_FROM, END = 3 * NS, 8 * NS, 12 * NS         # after START
RECOVERY_NS = int(CONFIRM_SEC * NS) + 2 * TICK_PERIOD


def header(ns):
    return SimpleNamespace(stamp=SimpleNamespace(sec=ns // NS, nanosec=ns % NS))


def frame(stamp_ns):
    return SimpleNamespace(header=header(stamp_ns), height=2, width=2, encoding='rgb8', step=6, is_bigendian=0,
                           data=bytes(12))


def joint_state(stamp_ns):
    return SimpleNamespace(header=header(stamp_ns), name=list(JOINTS), position=[0.0, 0.0])


def delivery(k):
    """A few ms, varying message to message (never the same fastest one)."""
    return (2 + (k * 7) % 5) * MS


def simulate(camera_offset=lambda t: 0, joint_offset=lambda t: 0, limits=LIMITS, stalls=(), end=END,
             every_camera=False):
    """Run the stream over [START, START + END); ``*_offset(t)``: how far the stamp of a message captured at
    START + t is moved (ns). ``stalls``: (from, to) after START during which nothing is delivered (the messages
    captured then arrive at ``to``, in a burst); ``every_camera``: the offset applies to both cameras (one camera
    machine), else to the first. Returns (buffer, ticks): per tick (t, skip reason or None,
    per camera (timed age, true age, receipt age) in seconds)."""
    events = []                               # (receive, order, kind, capture)
    for period, kind in ((CAMERA_PERIOD, 'camera'), (JOINT_PERIOD, 'joint'), (TICK_PERIOD, 'tick')):
        for k, capture in enumerate(range(START, START + end, period)):
            receive = capture if kind == 'tick' else capture + delivery(k)
            for stall_from, stall_to in stalls:
                if kind != 'tick' and START + stall_from <= receive < START + stall_to:
                    receive = START + stall_to + k * MS // 100
            events.append((receive, 1 if kind == 'tick' else 0, kind, capture))
    buf = InputBuffer()
    received = {}                              # camera -> (capture, receive) of its newest frame
    ticks = []
    for receive, _, kind, capture in sorted(events):
        t = capture - START
        if kind == 'camera':
            buf.put(LAYOUT.cameras[0], frame(capture + camera_offset(t)), receive)
            buf.put(LAYOUT.cameras[1], frame(capture + (camera_offset(t) if every_camera else 0)), receive)
            received = {name: (capture, receive) for name in CAMERAS}
        elif kind == 'joint':
            buf.put(LAYOUT.joint_states, joint_state(capture + joint_offset(t)), receive)
        else:
            try:
                assembled = buf.assemble(LAYOUT, limits, receive)
            except SkipTick as skip:
                ticks.append((t, skip.reason.value, {}))
                continue
            ticks.append((t, None, {name: (assembled.camera_ages_sec[name], (receive - received[name][0]) / NS,
                                           (receive - received[name][1]) / NS) for name in CAMERAS}))
    return buf, ticks


def assert_frames_timed_truthfully(ticks, error_sec=lambda t: 0.0):
    """Every frame used is timed between its capture and its receipt (1 us of float slack), give or take
    ``error_sec(t)``: the error of a camera clock that auto may take for the node's (a drifting one)."""
    for t, reason, ages in ticks:
        slack = 1e-6 + error_sec(t)
        for name, (timed, true_age, receipt_age) in ages.items():
            assert receipt_age - slack <= timed <= true_age + slack, (t / NS, name, timed, true_age, receipt_age)


def observing(ticks, start, end):
    return [t for t, reason, _ in ticks if start <= t < end and reason is None]


def recovery_ns(ticks, good_from=GOOD_FROM):
    """From the return of good stamps to the first tick that observes again."""
    return min(observing(ticks, good_from, END)) - good_from


def steps(offset):
    """Stamps moved by ``offset`` between BAD_FROM and GOOD_FROM."""
    return lambda t: offset if BAD_FROM <= t < GOOD_FROM else 0


def glitch(offset):
    """One camera frame's stamp moved by ``offset``, at BAD_FROM."""
    return lambda t: offset if t == BAD_FROM else 0


def events_of(buf):
    return [(event.input, event.jump, event.shift_ns) for event in buf.take_clock_events()]


# ---- a steady other clock -----------------------------------------------------------------------------------
@pytest.mark.parametrize('offset', [10**6 * NS, -(10**6) * NS, 2 * NS],
                         ids=['1e6 s ahead', '1e6 s behind', '2 s ahead'])
def test_a_camera_on_another_clock_from_the_start_is_timed_by_receipt(offset):
    buf, ticks = simulate(camera_offset=lambda t: offset)
    assert_frames_timed_truthfully(ticks)
    assert all(reason is None for _, reason, _ in ticks[1:]), [r for _, r, _ in ticks if r]
    assert buf.assemble(LAYOUT, LIMITS, START + END).clock.name == 'receive'
    assert events_of(buf) == []


# ---- steps, persistent then back -------------------------------------------------------------------------------
@pytest.mark.parametrize('offset', [10**6 * NS, -(10**6) * NS, 5 * NS, -5 * NS],
                         ids=['1e6 s ahead', '1e6 s behind', '5 s forward', '5 s back'])
def test_a_camera_clock_step_is_a_counted_jump_and_the_node_observes_on_both_sides(offset):
    buf, ticks = simulate(camera_offset=steps(offset))
    assert_frames_timed_truthfully(ticks)
    # The old offset held until BAD_FROM, then the new one from the jump's confirmation on, the old one again
    # soon after GOOD_FROM.
    assert len(observing(ticks, 0, BAD_FROM)) == BAD_FROM // TICK_PERIOD - 1         # all but the one at 0
    assert min(observing(ticks, BAD_FROM, GOOD_FROM)) - BAD_FROM <= RECOVERY_NS
    assert recovery_ns(ticks) <= RECOVERY_NS
    refused = {reason for t, reason, _ in ticks[1:] if reason is not None}
    assert refused <= {'camera_clock_jump'}, refused
    # Two jumps of the camera (there and back), in the directions they went; nothing else.
    assert events_of(buf) == [(CAMERAS[0], True, offset), (CAMERAS[0], True, -offset)]


# ---- one glitched frame ------------------------------------------------------------------------------------------
@pytest.mark.parametrize('offset', [10**6 * NS, -(10**6) * NS, 5 * NS, -5 * NS, 300 * MS, -300 * MS])
def test_one_glitched_stamp_is_an_outlier_not_a_jump(offset):
    """The glitched frame is refused (or timed by receipt), the next good frame observed; the estimate never
    moves (the plain smallest delay did, blinding the camera for DELAY_WINDOW frames)."""
    buf, ticks = simulate(camera_offset=glitch(offset))
    assert_frames_timed_truthfully(ticks)
    assert len(observing(ticks, 0, END)) >= len(ticks) - 2
    events = events_of(buf)
    if abs(offset) > 0.5 * NS:
        assert events == [(CAMERAS[0], False, offset)]
    else:                                   # within delivery jitter's bound: absorbed by the floor's order statistic
        assert events == []


def test_the_floor_ignores_two_outliers_and_takes_up_a_step_after_the_third():
    clock = StampClock()
    for k in range(DELAY_WINDOW):
        clock.observe(START + k * CAMERA_PERIOD, START + k * CAMERA_PERIOD + 3 * MS)
    base = START + DELAY_WINDOW * CAMERA_PERIOD
    clock.observe(base + 400 * MS, base + 3 * MS)           # two stamps 0.4 s ahead: within the jump bound
    clock.observe(base + 400 * MS, base + 4 * MS)
    assert clock.floor == 3 * MS
    clock.observe(base + 400 * MS, base + 5 * MS)
    assert clock.floor < 0


# ---- slow drift --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('rate', [0.05, -0.05], ids=['ahead', 'behind'])
def test_a_slow_drift_is_followed_without_a_jump(rate):
    """The cameras' machine's clock drifts 50 ms per second against the node's (far worse than any crystal),
    1.5 s over the run. No jump, no outlier; the node observes on (nearly) every tick. While auto takes the
    stamps for the node's clock (ahead by less than 5 ms, behind by less than half of max_image_age_sec: no
    clock can tell that from a slow delivery) frames are timed by their stamps, off by the drift; then by
    receipt, before a frame timed by its stamp would look stale."""
    buf, ticks = simulate(camera_offset=lambda t: int(rate * t), every_camera=True, end=30 * NS)
    assert_frames_timed_truthfully(ticks, error_sec=lambda t: abs(rate * t) / NS)
    assert events_of(buf) == []
    assert buf.assemble(LAYOUT, LIMITS, START + 30 * NS).clock.name == 'receive'
    blind = [t / NS for t, reason, _ in ticks[1:] if reason is not None]
    assert len(blind) <= 2, blind


# ---- a delivery stall is no jump -------------------------------------------------------------------------------
def test_a_delivery_stall_is_not_a_clock_jump():
    """Nothing delivered for 1.5 s, then everything at once: the late frames are old (refused), the frames after
    the stall observed at once; no jump, and the floor never moved."""
    buf, ticks = simulate(stalls=[(BAD_FROM, BAD_FROM + 1500 * MS)])
    assert_frames_timed_truthfully(ticks)
    assert all(not event.jump for event in buf.take_clock_events())
    assert min(observing(ticks, BAD_FROM + 1500 * MS, END)) - (BAD_FROM + 1500 * MS) <= 2 * CAMERA_PERIOD


# ---- joint states: the same rule ---------------------------------------------------------------------------------
@pytest.mark.parametrize('offset', [10**6 * NS, -(10**6) * NS, 5 * NS, -5 * NS],
                         ids=['1e6 s ahead', '1e6 s behind', '5 s forward', '5 s back'])
def test_a_joint_state_clock_step_is_the_same_jump(offset):
    buf, ticks = simulate(joint_offset=steps(offset))
    refused = {reason for t, reason, _ in ticks[1:] if reason is not None}
    assert refused <= {'joint_state_clock_jump'}, refused
    assert min(observing(ticks, BAD_FROM, GOOD_FROM)) - BAD_FROM <= RECOVERY_NS
    assert recovery_ns(ticks) <= RECOVERY_NS
    assert events_of(buf) == [(JOINT_STATES, True, offset), (JOINT_STATES, True, -offset)]


def test_joint_states_on_another_clock_are_timed_by_receipt_and_still_go_stale():
    """Stamps 1e6 s ahead: auto times them by receipt (the header stamp would never go stale), so a publisher
    that stops is still noticed; joint_state_clock header refuses them as joint_state_future."""
    buf, ticks = simulate(joint_offset=lambda t: 10**6 * NS)
    assert all(reason is None for _, reason, _ in ticks[1:])
    late = START + END + NS
    with pytest.raises(SkipTick) as info:
        buf.assemble(LAYOUT, replace(LIMITS, max_image_age_sec=5.0), late)
    assert info.value.reason.value == 'joint_state_stale'
    measured = buf.measured(JOINTS, '/joint_states', LIMITS, late)
    assert measured.positions is None and 'old' in measured.problem
    with pytest.raises(SkipTick) as info:
        buf.assemble(LAYOUT, replace(LIMITS, joint_state_clock='header'), START + END)
    assert info.value.reason.value == 'joint_state_future'


# ---- ROS time jumping back (a bag played again): the old timeline's messages still in flight ------------------
def test_after_a_jump_back_the_old_timelines_messages_in_flight_are_dropped():
    """ROS time jumps back 20 s (use_sim_time); the executor takes the jump before the frames and the joint state
    queued ahead of it, stamped in the old timeline (20 s ahead now). They are dropped, not kept to be refused as
    camera_future tick after tick; each input's first message of the new timeline ends that."""
    limits = replace(LIMITS, sim_time=True)
    buf = InputBuffer()
    now = START - 20 * NS                         # the new timeline
    buf.drop_timed(back_sec=20.0)
    for entry in LAYOUT.cameras:
        buf.put(entry, frame(START), now)         # old timeline, in flight
    buf.put(LAYOUT.joint_states, joint_state(START), now)
    with pytest.raises(SkipTick) as info:
        buf.assemble(LAYOUT, limits, now)
    assert info.value.reason.value == 'camera_missing'
    assert buf.measured(JOINTS, '/joint_states', limits, now).waiting
    later = now + 100 * MS
    for entry in LAYOUT.cameras:
        buf.put(entry, frame(later), later)       # the new timeline's first frames
    buf.put(LAYOUT.joint_states, joint_state(later), later)
    assert buf.assemble(LAYOUT, limits, later).stamp_ns == later
    # From then on a frame stamped ahead is judged as any (camera_future), not dropped.
    buf.put(LAYOUT.cameras[0], frame(later + 20 * NS), later)
    with pytest.raises(SkipTick) as info:
        buf.assemble(LAYOUT, limits, later)
    assert info.value.reason.value == 'camera_future'
