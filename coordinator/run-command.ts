// Placeholder until the run command lands.
export async function runCommand(_args: string[]): Promise<number> {
  console.error("prima-coord run: not built yet");
  return 1;
}
