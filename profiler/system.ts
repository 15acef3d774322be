// What the device is: operating system (Android/Termux told apart from Linux), kernel build, CPU,
// and the cgroup limits this process runs under (v1 and v2). Cheap reads of /proc and /sys only.
import { existsSync, readFileSync } from "node:fs";
import { arch, availableParallelism, cpus, platform, release, version } from "node:os";
import { join } from "node:path";
import type { DeviceOs } from "../halda/index.js";

function read(path: string): string | undefined {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return undefined;
  }
}

/** "android" on Termux or any Android userland (its Linux kernel says little), else by platform. */
export function detectOs(env: NodeJS.ProcessEnv = process.env, fileExists: (p: string) => boolean = existsSync, plat: string = platform()): DeviceOs {
  if (plat === "android" || env.TERMUX_VERSION !== undefined || fileExists("/system/build.prop")) return "android";
  if (plat === "darwin") return "macos";
  return "linux";
}

export interface SystemInfo {
  readonly os: DeviceOs;
  readonly platform: string;
  readonly arch: string;
  /** Kernel release and build ("6.1.0-18-amd64", "#1 SMP PREEMPT_DYNAMIC Debian ..."). */
  readonly kernelRelease: string;
  readonly kernelVersion: string;
  readonly cpuModel: string;
  /** Logical CPUs this process may run on (cpuset and affinity honoured). */
  readonly logicalCpus: number;
  /** /etc/machine-id where there is one: tells two identical machines apart. */
  readonly machineId: string;
  /** This boot's id (Linux): machines cloned from one image share a machine-id but not a boot; absent
   * in reports from before it was sent. */
  readonly bootId?: string;
}

export function systemInfo(): SystemInfo {
  const list = cpus();
  return {
    os: detectOs(),
    platform: platform(),
    arch: arch(),
    kernelRelease: release(),
    kernelVersion: version(),
    cpuModel: cpuName(list[0]?.model ?? "", read("/proc/cpuinfo") ?? "", read("/proc/device-tree/model")),
    logicalCpus: availableParallelism(),
    machineId: (read("/etc/machine-id") ?? read("/var/lib/dbus/machine-id") ?? "").trim(),
    bootId: (read("/proc/sys/kernel/random/boot_id") ?? "").trim(),
  };
}

// ---- the CPU's name ---------------------------------------------------------------------------

/** ARM's CPU implementer and part numbers (/proc/cpuinfo) as lscpu names them (util-linux lscpu-arm.c). */
const ARM_VENDORS: Record<number, string> = {
  0x41: "ARM", 0x42: "Broadcom", 0x43: "Cavium", 0x48: "HiSilicon", 0x4e: "NVIDIA", 0x51: "Qualcomm", 0x53: "Samsung",
  0x61: "Apple", 0xc0: "Ampere",
};
const ARM_PARTS: Record<number, Record<number, string>> = {
  0x41: {
    0xd03: "Cortex-A53", 0xd04: "Cortex-A35", 0xd05: "Cortex-A55", 0xd07: "Cortex-A57", 0xd08: "Cortex-A72",
    0xd09: "Cortex-A73", 0xd0a: "Cortex-A75", 0xd0b: "Cortex-A76", 0xd0c: "Neoverse-N1", 0xd0d: "Cortex-A77",
    0xd40: "Neoverse-V1", 0xd41: "Cortex-A78", 0xd44: "Cortex-X1", 0xd46: "Cortex-A510", 0xd47: "Cortex-A710",
    0xd48: "Cortex-X2", 0xd49: "Neoverse-N2", 0xd4d: "Cortex-A715", 0xd4e: "Cortex-X3", 0xd80: "Cortex-A520",
    0xd81: "Cortex-A720", 0xd82: "Cortex-X4",
  },
  0x51: {
    0x800: "Falkor-V1/Kryo", 0x801: "Kryo-V2", 0x802: "Kryo-3XX-Gold", 0x803: "Kryo-3XX-Silver",
    0x804: "Kryo-4XX-Gold", 0x805: "Kryo-4XX-Silver",
  },
};

export interface ArmCore { readonly vendor: string; readonly model: string; readonly count: number }

/** The cores an ARM /proc/cpuinfo lists ("CPU implementer" and "CPU part" per processor, no "model
 * name" there), grouped by kind in the order they appear: big.LITTLE gives two or three groups. */
export function armCores(cpuinfo: string): ArmCore[] {
  const groups = new Map<string, { vendor: string; model: string; count: number }>();
  for (const block of cpuinfo.split(/\n\s*\n/)) {
    const impl = /^CPU implementer\s*:\s*(0x[0-9a-f]+)/im.exec(block)?.[1];
    const part = /^CPU part\s*:\s*(0x[0-9a-f]+)/im.exec(block)?.[1];
    if (!impl || !part) continue;
    const i = Number(impl), p = Number(part);
    const vendor = ARM_VENDORS[i] ?? `implementer ${impl}`;
    const model = ARM_PARTS[i]?.[p] ?? `part ${part}`;
    const g = groups.get(`${vendor} ${model}`) ?? { vendor, model, count: 0 };
    g.count++;
    groups.set(`${vendor} ${model}`, g);
  }
  return [...groups.values()];
}

/** A name for the CPU: Node's (x86's "model name"), else on ARM the board (device tree: "Raspberry Pi 4
 * Model B Rev 1.4") or the SoC (cpuinfo's "Hardware" line, older and Android kernels) with its cores
 * ("4x ARM Cortex-A72"; big.LITTLE as "4x ARM Cortex-A55 + 4x ARM Cortex-A76"). */
export function cpuName(nodeModel: string, cpuinfo: string, deviceTreeModel?: string): string {
  const m = nodeModel.trim();
  if (m && m !== "unknown") return m;
  const cores = armCores(cpuinfo).map((c) => `${c.count}x ${c.vendor} ${c.model}`).join(" + ");
  const board = deviceTreeModel?.replace(/\0/g, "").trim() || /^Hardware\s*:\s*(.+)$/im.exec(cpuinfo)?.[1].trim();
  if (board && cores) return `${board} (${cores})`;
  return board || cores || /^model name\s*:\s*(.+)$/im.exec(cpuinfo)?.[1].trim() || "unknown CPU";
}

// ---- cgroups ---------------------------------------------------------------------------------

export interface CgroupPaths {
  /** Directory of this process's memory cgroup (v1 memory controller, or the v2 group). */
  readonly memory?: { readonly version: 1 | 2; readonly dir: string };
  readonly cpu?: { readonly version: 1 | 2; readonly dir: string };
  readonly blkio?: { readonly version: 1 | 2; readonly dir: string };
}

interface Mount { readonly point: string; readonly fs: string; readonly options: string[]; readonly root: string }

function mounts(mountinfo: string): Mount[] {
  const out: Mount[] = [];
  for (const line of mountinfo.split("\n")) {
    const [left, right] = line.split(" - ");
    if (!right) continue;
    const l = left.split(" "), r = right.split(" ");
    out.push({ root: l[3], point: l[4].replace(/\\040/g, " "), fs: r[0], options: (r[2] ?? "").split(",") });
  }
  return out;
}

/**
 * This process's cgroup directories, from /proc/self/cgroup and /proc/self/mountinfo. In a container
 * the listed path may not exist inside its mount (the mount's root is already our group): then the
 * mount point itself is the group.
 */
export function cgroupPaths(procCgroup = read("/proc/self/cgroup") ?? "", mountinfo = read("/proc/self/mountinfo") ?? "", exists: (p: string) => boolean = existsSync): CgroupPaths {
  const ms = mounts(mountinfo);
  const v1: Record<string, string> = {};
  let v2Path: string | undefined;
  for (const line of procCgroup.split("\n")) {
    const m = line.match(/^(\d+):([^:]*):(.*)$/);
    if (!m) continue;
    if (m[1] === "0" && m[2] === "") v2Path = m[3];
    else for (const c of m[2].split(",")) v1[c] = m[3];
  }
  const locate = (mount: Mount, path: string): string => {
    const rel = mount.root !== "/" && path.startsWith(mount.root) ? path.slice(mount.root.length) : path;
    const dir = join(mount.point, rel).replace(/(.)\/+$/, "$1");
    return exists(dir) ? dir : mount.point;
  };
  const v1Dir = (controller: string): { version: 1; dir: string } | undefined => {
    const mount = ms.find((x) => x.fs === "cgroup" && x.options.includes(controller));
    const path = v1[controller];
    return mount && path !== undefined ? { version: 1, dir: locate(mount, path) } : undefined;
  };
  const v2Mount = ms.find((x) => x.fs === "cgroup2");
  const v2Dir = (controller: string): { version: 2; dir: string } | undefined => {
    if (!v2Mount || v2Path === undefined) return undefined;
    const controllers = read(join(v2Mount.point, "cgroup.controllers")) ?? "";
    if (!controllers.split(/\s+/).includes(controller)) return undefined;
    return { version: 2, dir: locate(v2Mount, v2Path) };
  };
  return {
    memory: v1Dir("memory") ?? v2Dir("memory"),
    cpu: v1Dir("cpu") ?? v2Dir("cpu"),
    blkio: v1Dir("blkio") ?? v2Dir("io"),
  };
}

/** CPU bandwidth limit in CPUs (quota / period), or undefined when unlimited. */
export function cpuQuota(paths: CgroupPaths = cgroupPaths()): number | undefined {
  const c = paths.cpu;
  if (!c) return undefined;
  if (c.version === 1) {
    const quota = Number(read(join(c.dir, "cpu.cfs_quota_us")));
    const period = Number(read(join(c.dir, "cpu.cfs_period_us")));
    return quota > 0 && period > 0 ? quota / period : undefined;
  }
  const [q, p] = (read(join(c.dir, "cpu.max")) ?? "max").trim().split(/\s+/);
  return q !== "max" && Number(q) > 0 && Number(p) > 0 ? Number(q) / Number(p) : undefined;
}

export interface DiskThrottle {
  readonly readBytesPerS?: number;
  readonly readIops?: number;
}

/** Read throttling the blkio (v1) or io (v2) controller puts on block device major:minor. */
export function diskThrottle(device: string, paths: CgroupPaths = cgroupPaths()): DiskThrottle {
  const b = paths.blkio;
  if (!b) return {};
  const pick = (text: string | undefined): number | undefined => {
    for (const line of (text ?? "").split("\n")) {
      const [dev, v] = line.trim().split(/\s+/);
      if (dev === device && Number(v) > 0) return Number(v);
    }
    return undefined;
  };
  if (b.version === 1) {
    return { readBytesPerS: pick(read(join(b.dir, "blkio.throttle.read_bps_device"))), readIops: pick(read(join(b.dir, "blkio.throttle.read_iops_device"))) };
  }
  for (const line of (read(join(b.dir, "io.max")) ?? "").split("\n")) {
    const parts = line.trim().split(/\s+/);
    if (parts[0] !== device) continue;
    const kv = Object.fromEntries(parts.slice(1).map((p) => p.split("=")));
    const num = (s: string | undefined) => (s && s !== "max" && Number(s) > 0 ? Number(s) : undefined);
    return { readBytesPerS: num(kv.rbps), readIops: num(kv.riops) };
  }
  return {};
}

/** A cache size as sysfs writes it ("32768K", "1M"), in bytes; undefined when unreadable. */
export function parseCacheSize(text: string | undefined): number | undefined {
  const m = /^\s*(\d+)\s*([KMG]?)/i.exec(text ?? "");
  if (!m) return undefined;
  const unit = { "": 1, K: 1 << 10, M: 1 << 20, G: 1 << 30 }[m[2].toUpperCase() as "" | "K" | "M" | "G"];
  return Number(m[1]) * unit || undefined;
}

/** The largest data or unified cache CPU 0 reports (Linux and Android sysfs), in bytes; undefined
 * where there is none to read (macOS, some phones). */
export function lastLevelCacheBytes(dir = "/sys/devices/system/cpu/cpu0/cache"): number | undefined {
  let best: number | undefined;
  for (let i = 0; i < 8; i++) {
    const type = read(join(dir, `index${i}`, "type"))?.trim();
    if (type === undefined) break;
    if (type === "Instruction") continue;
    const size = parseCacheSize(read(join(dir, `index${i}`, "size")));
    if (size && (!best || size > best)) best = size;
  }
  return best;
}
