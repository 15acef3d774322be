/* Generated from ring/wire.ts (the one home of the wire format); do not edit. Regenerate with
 *   npx tsc -p tsconfig.json && node -e 'import("./dist/ring/wire.js").then((m) => process.stdout.write(m.wireHeaderC()))' > native/src/wire.h */
#ifndef PRIMA_WIRE_H
#define PRIMA_WIRE_H

#define PRIMA_WIRE_MAGIC "PRMA"
#define PRIMA_WIRE_HEADER_VERSION 1
#define PRIMA_WIRE_HEADER_BYTES 32
#define PRIMA_WIRE_CONTROL_PAYLOAD_MAX_BYTES 65536
#define PRIMA_WIRE_U32_MAX 4294967295u
#define PRIMA_WIRE_TYPE_HELLO 1
#define PRIMA_WIRE_TYPE_ACTIVATIONS 2
#define PRIMA_WIRE_TYPE_ERROR 3
#define PRIMA_WIRE_TYPE_KV_SHIFT 4
#define PRIMA_WIRE_DTYPE_F32 0
#define PRIMA_WIRE_DTYPE_F16 1
#define PRIMA_WIRE_DTYPE_F32_BYTES 4
#define PRIMA_WIRE_DTYPE_F16_BYTES 2
#define PRIMA_WIRE_AT_MAGIC 0
#define PRIMA_WIRE_AT_HEADER_VERSION 4
#define PRIMA_WIRE_AT_FRAME_TYPE 6
#define PRIMA_WIRE_AT_REQUEST_ID 8
#define PRIMA_WIRE_AT_FIRST_TOKEN_POSITION 12
#define PRIMA_WIRE_AT_N_TOKENS 16
#define PRIMA_WIRE_AT_CYCLE 18
#define PRIMA_WIRE_AT_PAYLOAD_DTYPE 20
#define PRIMA_WIRE_AT_RESERVED 22
#define PRIMA_WIRE_AT_ROW_WIDTH 24
#define PRIMA_WIRE_AT_PAYLOAD_BYTES 28
#define PRIMA_WIRE_LINK_KEY_BYTES 32
#define PRIMA_WIRE_RECORD_SEQ_BYTES 8
#define PRIMA_WIRE_RECORD_TAG_BYTES 16

#endif
