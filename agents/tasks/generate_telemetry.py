"""Writes corpus/kestrel/telemetry-NNN-MMM.md, the six volumes of Kestrel-3's telemetry archive
(deterministic and fictional; run again to reproduce them byte for byte)."""
import os
import random
rng = random.Random(3)
notes = ["nominal", "nominal", "nominal", "star tracker recalibrated", "reaction wheel 2 spin-down test",
         "safe-mode drill", "downlink via the southern station", "heater cycle extended",
         "solar array offpointed for thermal test", "memory scrub completed", "nominal", "nominal"]
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "kestrel")
os.makedirs(out, exist_ok=True)
for vol in range(6):
    first, last = vol * 70 + 1, vol * 70 + 70
    lines = [f"# Kestrel-3 Telemetry Archive, Days {first}-{last}", "",
             f"Volume {vol + 1} of 6 of the daily engineering summary of the Kestrel-3 sample-return probe,",
             "as kept by the ground team. Each entry gives the mission day, the battery temperature at",
             "the daily pass (degrees Celsius), the main bus voltage (volts), the three reaction wheel",
             "speeds (revolutions per minute), the pointing error (degrees), the data volume downlinked",
             "that day (megabytes) and the operator's note.", ""]
    peak = (0, 0)
    for day in range(first, last + 1):
        temp = round(18 + 6 * rng.random() + (day % 97) / 40, 1)
        note = rng.choice(notes)
        if day == 287:
            temp, note = 39.6, "battery heater stuck on for six hours, reset from the ground"
        peak = max(peak, (temp, day))
        volt = round(27.4 + rng.random() * 0.8, 1)
        wheels = "/".join(str(rng.randint(1150, 1250)) for _ in range(3))
        err = round(rng.random() * 0.03, 3)
        mb = rng.randint(280, 520)
        lines.append(f"- Day {day:03d}: battery {temp} C, bus {volt} V, wheels {wheels} rpm, "
                     f"pointing error {err} deg, downlink {mb} MB; note: {note}.")
    lines += ["", f"Highest battery temperature in this volume: {peak[0]} C, on day {peak[1]:03d}.", ""]
    open(f"{out}/telemetry-{first:03d}-{last:03d}.md", "w").write("\n".join(lines))
