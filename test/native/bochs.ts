// Runs a static x86 program as PID 1 of a Linux booted under bochs, to check AVX-512 code on a machine
// without AVX-512 (QEMU's emulator has none; Debian's bochs 2.7 is built with EVEX). Debian's cloud
// kernel boots from an ISO (isolinux) with an initramfs holding only the program as /init; what it prints
// comes back over the emulated serial port. The Debian packages are fetched once into .cache/bochs-boot.
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync, copyFileSync } from "node:fs";
import { join } from "node:path";
import { gzipSync } from "node:zlib";

const root = join(import.meta.dirname, "..", "..");
const cache = join(root, ".cache", "bochs-boot");
const BIOS = "/usr/share/bochs/BIOS-bochs-latest";
const VGABIOS = "/usr/share/vgabios/vgabios.bin";

// bochs 2.7's CPU models misreport or mis-emulate a few things Linux 6.1 uses: the compacted XSAVE size
// (the kernel then turns XSAVE, and with it AVX, off), PKRU's XSAVE slot, and on the Ice Lake model one
// of FSRM / the speculation-control MSRs (boot stops after "LSM: Security Framework initializing").
// The kernel is told to leave them alone; user space still sees every AVX-512 flag through CPUID.
const CMDLINE = "console=ttyS0,115200 quiet panic=-1 mitigations=off " +
  "clearcpuid=pku,xsaves,xsavec,fsrm,rdpid,umip,gfni,vaes,vpclmulqdq,md_clear,flush_l1d,arch_capabilities";

function sh(cmd: string, args: string[], cwd?: string): string {
  const r = spawnSync(cmd, args, { cwd, encoding: "utf8", timeout: 300_000 });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(" ")} failed: ${r.stderr || r.error}`);
  return r.stdout;
}

function has(cmd: string): boolean {
  return spawnSync("sh", ["-c", `command -v ${cmd}`]).status === 0;
}

/** Why the bochs check cannot run here, or null when it can. */
export function bochsMissing(): string | null {
  if (process.arch !== "x64") return "not an x86-64 machine";
  if (!has("bochs") || !existsSync(BIOS) || !existsSync(VGABIOS)) return "bochs not installed (apt-get install bochs bochs-term bochsbios vgabios)";
  if (!has("gcc")) return "gcc not installed";
  if (!existsSync(join(cache, "root")) && (!has("apt-get") || !has("dpkg-deb"))) return "no apt-get/dpkg-deb to fetch a kernel and isolinux";
  return null;
}

/** Debian's cloud kernel, isolinux and genisoimage, unpacked into .cache/bochs-boot/root (once). */
function bootFiles(): { kernel: string; isolinux: string; ldlinux: string; genisoimage: string } {
  const unpacked = join(cache, "root");
  if (!existsSync(join(unpacked, "usr", "bin", "genisoimage"))) {
    mkdirSync(cache, { recursive: true });
    const kernelPkg = /Depends: (linux-image-\S+)/.exec(sh("apt-cache", ["depends", "linux-image-cloud-amd64"]))?.[1];
    if (!kernelPkg) throw new Error("apt-cache names no kernel for linux-image-cloud-amd64");
    sh("apt-get", ["download", kernelPkg, "isolinux", "syslinux-common", "genisoimage"], cache);
    for (const deb of readdirSync(cache).filter((f) => f.endsWith(".deb"))) sh("dpkg-deb", ["-x", join(cache, deb), unpacked]);
  }
  const kernel = readdirSync(join(unpacked, "boot")).find((f) => f.startsWith("vmlinuz-"));
  if (!kernel) throw new Error(`no vmlinuz in ${unpacked}/boot`);
  return {
    kernel: join(unpacked, "boot", kernel),
    isolinux: join(unpacked, "usr", "lib", "ISOLINUX", "isolinux.bin"),
    ldlinux: join(unpacked, "usr", "lib", "syslinux", "modules", "bios", "ldlinux.c32"),
    genisoimage: join(unpacked, "usr", "bin", "genisoimage"),
  };
}

/** A gzipped newc cpio archive holding one executable, /init. */
function initramfs(init: Buffer): Buffer {
  const entry = (name: string, data: Buffer, mode: number, ino: number): Buffer => {
    const nameBytes = Buffer.from(`${name}\0`);
    const fields = [ino, mode, 0, 0, 1, 0, data.length, 0, 0, 0, 0, nameBytes.length, 0];
    const header = Buffer.from(`070701${fields.map((v) => v.toString(16).toUpperCase().padStart(8, "0")).join("")}`);
    const pad = (n: number) => Buffer.alloc((4 - (n % 4)) % 4);
    const head = Buffer.concat([header, nameBytes]);
    return Buffer.concat([head, pad(head.length), data, pad(data.length)]);
  };
  return gzipSync(Buffer.concat([entry("init", init, 0o100755, 1), entry("TRAILER!!!", Buffer.alloc(0), 0, 0)]), { level: 1 });
}

/** A bootable ISO in dir that runs `init` (a static x86-64 executable) as PID 1. */
export function bootImage(dir: string, init: string): string {
  const files = bootFiles();
  const iso = join(dir, "iso");
  mkdirSync(join(iso, "isolinux"), { recursive: true });
  copyFileSync(files.isolinux, join(iso, "isolinux", "isolinux.bin"));
  copyFileSync(files.ldlinux, join(iso, "isolinux", "ldlinux.c32"));
  copyFileSync(files.kernel, join(iso, "vmlinuz"));
  writeFileSync(join(iso, "initrd.gz"), initramfs(readFileSync(init)));
  writeFileSync(join(iso, "isolinux", "isolinux.cfg"),
    `DEFAULT check\nPROMPT 0\nTIMEOUT 0\nLABEL check\n  KERNEL /vmlinuz\n  APPEND initrd=/initrd.gz ${CMDLINE}\n`);
  const image = join(dir, "boot.iso");
  sh(files.genisoimage, ["-quiet", "-o", image, "-b", "isolinux/isolinux.bin", "-c", "isolinux/boot.cat", "-no-emul-boot",
    "-boot-load-size", "4", "-boot-info-table", "-R", iso]);
  return image;
}

/** Boots the image on an emulated CPU model (bochs --help cpu lists them) and returns what the machine
 * wrote to its serial port, once `done` matches it, the machine powers off, or the time runs out. */
/** Bochs's RFB display binds the first free port from 5900. Two instances started together can both
 * bind 5900 (SO_REUSEADDR); the one whose listen() then fails retries with the same socket, which
 * cannot be bound again, and panics ("RFB could not bind any port between 5900 and 5949"): the check
 * failed so in 3 of 4 runs one afternoon. Each instance starts once the one before it listens. */
let displayTurn: Promise<void> = Promise.resolve();

export async function runUnderBochs(image: string, cpu: string, dir: string, done: RegExp, timeoutMs: number): Promise<string> {
  const turn = displayTurn;
  let displayUp!: () => void;
  displayTurn = new Promise<void>((resolve) => { displayUp = resolve; });
  await turn;
  const work = join(dir, cpu);
  mkdirSync(work, { recursive: true });
  const serial = join(work, "serial.out");
  writeFileSync(serial, "");
  writeFileSync(join(work, "bochsrc"), [
    "megs: 256",
    `cpu: model=${cpu}, count=1, ips=200000000`,
    `romimage: file=${BIOS}`,
    `vgaromimage: file=${VGABIOS}`,
    `ata0-master: type=cdrom, path=${image}, status=inserted`,
    "boot: cdrom",
    `com1: enabled=1, mode=file, dev=${serial}`,
    // Debian builds no "nogui"; rfb only listens for a viewer and does not wait for one
    'display_library: rfb, options="timeout=0"',
    `log: ${join(work, "bochs.log")}`,
    "clock: sync=none",
  ].join("\n") + "\n");
  // Debian's bochs has the internal debugger, which stops before the first instruction: "c" continues
  writeFileSync(join(work, "debugger.rc"), "c\n");
  const child = spawn("bochs", ["-q", "-f", join(work, "bochsrc"), "-rc", join(work, "debugger.rc")],
    { cwd: work, stdio: ["ignore", "ignore", "ignore"] });
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const started = Date.now();
  void (async () => {
    let gone = false;
    void exited.then(() => { gone = true; });
    const log = join(work, "bochs.log");
    while (!gone && Date.now() - started < 20_000) {
      if (existsSync(log) && /RFB.*(listening for connections|PANIC)/.test(readFileSync(log, "utf8"))) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    displayUp();
  })();
  let out = "";
  for (;;) {
    const ended = await Promise.race([exited.then(() => true), new Promise<boolean>((r) => setTimeout(() => r(false), 1000))]);
    out = readFileSync(serial, "utf8");
    if (ended || done.test(out)) break;
    if (Date.now() - started > timeoutMs) {
      out += `\n(bochs ${cpu}: no result after ${timeoutMs} ms)`;
      break;
    }
  }
  child.kill("SIGKILL");
  await exited;
  return out;
}
