// Placeholder until the make-model command lands.
export async function makeModelCommand(_args: string[]): Promise<number> {
  console.error("prima-coord make-model: not built yet");
  return 1;
}
