// Placeholder until the plan command lands.
export async function planCommand(_args: string[]): Promise<number> {
  console.error("prima-coord plan: not built yet");
  return 1;
}
