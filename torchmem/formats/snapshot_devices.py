"""Which device of a snapshot a command describes: one rule for every command.

A snapshot (``torch.cuda.memory._snapshot()``'s dict) holds every device of
one process: ``device_traces`` is a list indexed by device, and each segment
names its ``device``. ``torchmem replay``, ``advise``, ``plot``, ``viz``,
``stats`` and ``ranks`` all describe one device, chosen by this rule:

1. the device given (``--device N``), which must be in the snapshot;
2. else the device with an ``oom`` entry in its trace (the first, if several);
3. else the device with the most trace entries (the most history);
4. else, with no history at all, the device whose segments reserve the most;
5. else device 0.

    >>> choice = choose_device({"segments": [], "device_traces": [[], [{"action": "oom", "size": 1}]]})
    >>> choice.device, choice.describe()
    (1, 'device 1 (the one with the OOM)')
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceChoice:
    device: int
    reason: str       # "given", "oom", "history", "segments", "default"
    devices: int      # how many devices the snapshot has (traces or segments)

    def describe(self) -> str:
        """'device 1 (the one with the OOM)', for every command's output."""
        why = {"given": "given", "oom": "the one with the OOM", "history": "the one with the most history",
               "segments": "no history; the one whose segments reserve the most", "default": "the snapshot is empty"}
        if self.reason != "given" and self.devices <= 1:
            return f"device {self.device} (the only one)"
        return f"device {self.device} ({why[self.reason]})"


def snapshot_devices(snapshot: dict) -> list[int]:
    """The devices a snapshot has: those with a trace list, and those its segments name."""
    traces = snapshot.get("device_traces") or []
    devices = set(range(len(traces))) if isinstance(traces, list) else set()
    for seg in snapshot.get("segments") or []:
        if isinstance(seg, dict) and isinstance(seg.get("device"), int):
            devices.add(seg["device"])
    return sorted(devices)


def _trace(snapshot: dict, device: int) -> list:
    traces = snapshot.get("device_traces") or []
    t = traces[device] if isinstance(traces, list) and 0 <= device < len(traces) else []
    return t if isinstance(t, list) else []


def choose_device(snapshot: dict, device: int | None = None, name: str = "snapshot") -> DeviceChoice:
    """The device a command describes (see the module docstring).

    Raises ValueError naming `name` and the devices there are when `device`
    is not one of the snapshot's.
    """
    devices = snapshot_devices(snapshot)
    if device is not None:
        if isinstance(device, bool) or not isinstance(device, int) or device not in (devices or [0]):
            have = ", ".join(map(str, devices)) if devices else "none"
            raise ValueError(f"{name}: no device {device!r} (the snapshot's devices: {have})")
        return DeviceChoice(device, "given", len(devices))
    for d in devices:
        if any(isinstance(e, dict) and e.get("action") == "oom" for e in _trace(snapshot, d)):
            return DeviceChoice(d, "oom", len(devices))
    longest = max(devices, key=lambda d: (len(_trace(snapshot, d)), -d), default=None)
    if longest is not None and _trace(snapshot, longest):
        return DeviceChoice(longest, "history", len(devices))
    reserved: dict[int, int] = {}
    for seg in snapshot.get("segments") or []:
        if isinstance(seg, dict):
            d = seg.get("device", 0)
            reserved[d] = reserved.get(d, 0) + int(seg.get("total_size", 0) or 0)
    if reserved:
        return DeviceChoice(max(reserved, key=lambda d: (reserved[d], -d)), "segments", len(devices))
    return DeviceChoice(0, "default", len(devices))


def device_segments(snapshot: dict, device: int) -> list[dict]:
    """The snapshot's segments on `device` (a segment without a device field counts as on it)."""
    return [s for s in snapshot.get("segments") or [] if s.get("device", device) == device]
