// A cluster identity made in a process of its own, started by TrustStore.open: the certificate library
// it needs (@peculiar/x509 and its ASN.1 stack) leaves with this process. Loaded in the coordinator it
// stayed there, ~15 MiB for the process's life: a capped head's first run had that much less room for
// layers than every run after (4 x 200 MiB devices: 146 MiB for layers against 161; that run 0.90x the
// best hand-made plan, 1.10x once the library left). Prints the identity as the key file holds it.
import { createIdentity, savedIdentity } from "./store.js";

process.stdout.write(savedIdentity(await createIdentity()));
