// discovery/: finding the cluster on the local network over mDNS (DNS-SD `_prima._tcp`), and the
// escaping every string from the network gets before it reaches a terminal or a log.
export {
  SERVICE_TYPE, DISCOVERY_TIMEOUT_MS, DISCOVERY_GRACE_MS, publishCluster, browseClusters, findCluster, chooseCluster,
  clusterAddress, describeClusters, noClusterMessage,
  type ClusterAd, type PublishOptions, type Publication, type FoundCluster, type BrowseOptions, type FindOptions,
} from "./cluster.js";
export { DiscoveryError, INTERFACE_ENV, PORT_ENV, MDNS_PORT, resolveInterface, type MdnsOptions } from "./mdns.js";
export { printable } from "../base/index.js";
