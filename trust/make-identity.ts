// A cluster identity made in a process of its own, started by TrustStore.open: the certificate library
// it needs (@peculiar/x509 and its ASN.1 stack) leaves with this process. Loaded in the coordinator it
// stayed there, ~15 MiB for the process's life: a capped head's first run had that much less room for
// layers than every run after (4 x 200 MiB devices: 146 MiB for layers against 161, 0.9x the plan's
// speed against 1.7x). Prints the identity as the key file holds it.
import { createIdentity, savedIdentity } from "./store.js";

process.stdout.write(savedIdentity(await createIdentity()));
