// Refused connections in the log: one line per address per interval, then one line with the count of
// those it kept quiet; many addresses cannot grow it without bound either.
import { afterEach, describe, expect, it, vi } from "vitest";
import { DropLog } from "../../ring/drop-log.js";

describe("DropLog", () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it("logs the first refusal of an address at once and counts the rest into one line per interval", () => {
    vi.useFakeTimers();
    const lines: string[] = [];
    const log = new DropLog((l) => lines.push(l), "prima ring: port 7", 50);
    for (let i = 0; i < 1000; i++) log.note(`10.0.0.1:${4000 + i}`, i === 999 ? "the last reason" : "sent garbage");
    log.note("10.0.0.2:5000", "refused");
    log.note("[::1]:5001", "refused");
    expect(lines).toEqual([
      "prima ring: port 7 dropped 10.0.0.1:4000: sent garbage",
      "prima ring: port 7 dropped 10.0.0.2:5000: refused",
      "prima ring: port 7 dropped [::1]:5001: refused",
    ]);
    vi.advanceTimersByTime(49);
    expect(lines.length).toBe(3);
    vi.advanceTimersByTime(1);
    expect(lines.length).toBe(4);
    expect(lines[3]).toBe("prima ring: port 7 dropped 999 more connections from 10.0.0.1 in the last 50 ms (the last: the last reason)");
    // Still coming: still quiet, counted again; close() says what it holds.
    log.note("10.0.0.1:6000", "again");
    expect(lines.length).toBe(4);
    // An interval without refusals ends the quiet (10.0.0.2 and [::1] had none after their first).
    vi.advanceTimersByTime(50);
    expect(lines.length).toBe(5);
    log.note("10.0.0.2:5002", "back");
    expect(lines[5]).toBe("prima ring: port 7 dropped 10.0.0.2:5002: back");
    log.note("10.0.0.1:6001", "again");
    log.close();
    expect(lines[4]).toBe("prima ring: port 7 dropped 1 more connection from 10.0.0.1 in the last 50 ms (the last: again)");
    expect(lines[6]).toBe("prima ring: port 7 dropped 1 more connection from 10.0.0.1 in the last 50 ms (the last: again)");
    expect(lines.length).toBe(7);
    // Closed: no timer is left to log.
    vi.advanceTimersByTime(1000);
    expect(lines.length).toBe(7);
  });

  it("tracks a bounded number of addresses; the others are counted together", () => {
    const lines: string[] = [];
    const log = new DropLog((l) => lines.push(l), "p", 60_000);
    for (let i = 0; i < 1000; i++) log.note(`10.1.${i >> 8}.${i & 255}:1`, "refused");
    expect(lines.length).toBe(256);
    log.close();
    expect(lines.at(-1)).toBe("p dropped 744 more connections from other addresses in the last 60 s (the last: refused)");
    expect(lines.length).toBe(257);
  });
});
