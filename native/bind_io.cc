// File and stream I/O helpers for JS memory: where a buffer's aligned part starts (direct I/O needs
// memory aligned to the disk's block, and JS allocates without a say in alignment), and a chunk
// stream's AES-256-GCM records sealed and opened in place (src/seal.h), so a window's bytes are
// encrypted and decrypted where they lie instead of through fresh buffers.
#include <napi.h>

#include <cstdint>

#include "napi_util.h"

extern "C" {
#include "seal.h"
}

namespace {

using prima_napi::ThrowErr;
using prima_napi::ThrowType;

struct Bytes {
  uint8_t *data = nullptr;
  size_t length = 0;
};

/* A typed array's memory (shared or not), or false. */
bool ViewOf(const Napi::Value &v, Bytes *out) {
  if (!v.IsTypedArray()) return false;
  napi_typedarray_type type;
  size_t length = 0, offset = 0;
  void *data = nullptr;
  napi_value ab;
  if (napi_get_typedarray_info(v.Env(), v, &type, &length, &data, &ab, &offset) != napi_ok) return false;
  if (type != napi_uint8_array) return false;
  out->data = static_cast<uint8_t *>(data);
  out->length = length;
  return true;
}

/* alignGap(view, align): bytes from the view's first byte to the first address that is a multiple of
 * align (a power of two). */
Napi::Value AlignGap(const Napi::CallbackInfo &info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[0].IsTypedArray() || !info[1].IsNumber()) return ThrowType(env, "alignGap(view, align)");
  const int64_t align = info[1].As<Napi::Number>().Int64Value();
  if (align <= 0 || (align & (align - 1)) != 0) return ThrowType(env, "alignGap: align must be a power of two");
  napi_typedarray_type type;
  size_t length, offset;
  void *data = nullptr;
  napi_value ab;
  if (napi_get_typedarray_info(env, info[0], &type, &length, &data, &ab, &offset) != napi_ok) return ThrowType(env, "alignGap: not a typed array");
  const uintptr_t a = reinterpret_cast<uintptr_t>(data), m = static_cast<uintptr_t>(align - 1);
  return Napi::Number::New(env, static_cast<double>((m + 1 - (a & m)) & m));
}

/* One direction of a chunk stream: new StreamSeal(key32, encrypt). seal(aad, body, tag) encrypts body
 * in place and fills tag; open(aad, body, tag) decrypts in place and says whether the record was
 * authentic. Records carry no sequence number: each side counts, so a dropped, repeated or reordered
 * record fails to open. */
class StreamSeal : public Napi::ObjectWrap<StreamSeal> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "StreamSeal", {
      InstanceMethod<&StreamSeal::Seal>("seal"),
      InstanceMethod<&StreamSeal::Open>("open"),
      InstanceMethod<&StreamSeal::Close>("close"),
    });
  }

  StreamSeal(const Napi::CallbackInfo &info) : Napi::ObjectWrap<StreamSeal>(info) {
    Bytes key;
    if (info.Length() < 2 || !ViewOf(info[0], &key) || key.length != PRIMA_WIRE_LINK_KEY_BYTES || !info[1].IsBoolean()) {
      ThrowType(info.Env(), "new StreamSeal(key: 32-byte Uint8Array, encrypt: boolean)");
      return;
    }
    encrypt_ = info[1].As<Napi::Boolean>().Value();
    if (prima_seal_init(&seal_, key.data, 0, encrypt_ ? 1 : 0) != 0) ThrowErr(info.Env(), "StreamSeal: OpenSSL refused the key");
  }

  ~StreamSeal() { prima_seal_free(&seal_); }

 private:
  /* aad, body and a 16-byte tag, checked; false after throwing. */
  bool Parts(const Napi::CallbackInfo &info, const char *what, Bytes *aad, Bytes *body, Bytes *tag) {
    if (info.Length() < 3 || !ViewOf(info[0], aad) || !ViewOf(info[1], body) || !ViewOf(info[2], tag) || tag->length != PRIMA_WIRE_RECORD_TAG_BYTES) {
      ThrowType(info.Env(), std::string(what) + "(aad: Uint8Array, body: Uint8Array, tag: 16-byte Uint8Array)");
      return false;
    }
    if (!seal_.ctx) {
      ThrowErr(info.Env(), std::string(what) + ": the stream is closed");
      return false;
    }
    return true;
  }

  Napi::Value Seal(const Napi::CallbackInfo &info) {
    Bytes aad, body, tag;
    if (!Parts(info, "seal", &aad, &body, &tag)) return info.Env().Undefined();
    if (!encrypt_) return ThrowErr(info.Env(), "seal: this side opens records");
    if (prima_seal_parts(&seal_, aad.data, aad.length, body.data, body.data, body.length, tag.data) != 0) return ThrowErr(info.Env(), "seal: OpenSSL failed");
    return info.Env().Undefined();
  }

  Napi::Value Open(const Napi::CallbackInfo &info) {
    Bytes aad, body, tag;
    if (!Parts(info, "open", &aad, &body, &tag)) return info.Env().Undefined();
    if (encrypt_) return ThrowErr(info.Env(), "open: this side seals records");
    return Napi::Boolean::New(info.Env(), prima_open_parts(&seal_, aad.data, aad.length, body.data, body.length, tag.data) == PRIMA_OPEN_OK);
  }

  Napi::Value Close(const Napi::CallbackInfo &info) {
    prima_seal_free(&seal_);
    return info.Env().Undefined();
  }

  prima_seal seal_{nullptr, 0};
  bool encrypt_ = false;
};

}  // namespace

void RegisterIo(Napi::Env env, Napi::Object exports) {
  Napi::Object io = Napi::Object::New(env);
  io.Set("alignGap", Napi::Function::New(env, AlignGap, "alignGap"));
  io.Set("StreamSeal", StreamSeal::Define(env));
  exports.Set("io", io);
}
