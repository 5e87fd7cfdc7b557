/* The content-addressed kernel cache on disk (CuPy's scheme, hardened).
 *
 * Key: XXH3-128 over, in order and each length-prefixed: the entry format
 * version, the NVRTC build (mla_rtc_build_id), a user salt
 * (MLALAB_KERNEL_CACHE_SALT), the program name, the source text, every
 * option in order (the -arch=sm_XX target, -D values and include paths
 * among them), the name expressions (sorted, deduplicated), every in-memory
 * header (name + text, sorted by name: generated layout headers and every
 * header reached outside CUDA's include directories) and the names of the
 * headers not read (CUDA's own, unresolved ones).
 *
 * Entry file <dir>/<key>.cubin:
 *   "MLARTC" 0x00 0x01   magic + format version          8 bytes
 *   key digest                                           16
 *   payload length (u64 LE)                              8
 *   XXH3-128 of the payload                              16
 *   payload: u32 n; n x (u32 len, expr, u32 len, mangled);
 *            u32 len, log; u32 len, signatures; u64 len, cubin
 * Written to a temporary file in the same directory (".<key>.tmp.<pid>.XXXXXX"),
 * then renamed (atomic; concurrent writers of one key each rename a complete
 * file, readers see the old entry, a new one or none). A writer killed
 * mid-write leaves only its temp file, which nothing reads and the next write
 * to the directory removes. A short, long, foreign or corrupted entry is a
 * miss, recompiled and overwritten, never loaded. */
#ifndef MLA_RTC_CACHE_H
#define MLA_RTC_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "rtc.h"
#include "rtc_deps.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MLA_RTC_FORMAT_VERSION 1
#define MLA_RTC_KEY_HEX 33 /* 32 hex digits + NUL */

/* Key of a program whose headers are all in memory (deps->files). */
void mla_rtc_cache_key(const mla_rtc_program *p, const mla_rtc_deps *deps, const char *salt, char hex[MLA_RTC_KEY_HEX]);

enum { MLA_RTC_ENTRY_ABSENT = 0, MLA_RTC_ENTRY_HIT = 1, MLA_RTC_ENTRY_CORRUPT = 2 };

/* Serializes / checks and parses an entry (pure; tested without a disk). */
int mla_rtc_entry_encode(const char hex[MLA_RTC_KEY_HEX], const mla_rtc_binary *b, char **out, size_t *len);
/* Returns MLA_RTC_ENTRY_HIT and fills b, or MLA_RTC_ENTRY_CORRUPT with the
 * reason in `why` (size n). */
int mla_rtc_entry_decode(const char hex[MLA_RTC_KEY_HEX], const char *data, size_t len, mla_rtc_binary *b, char *why,
                         size_t n);

/* Reads <dir>/<hex>.cubin: ABSENT, HIT (b filled) or CORRUPT (why says how). */
int mla_rtc_cache_read(const char *dir, const char hex[MLA_RTC_KEY_HEX], mla_rtc_binary *b, char *why, size_t n);
/* Writes the entry atomically, creating dir if needed; with save_source the
 * program text goes beside it as <hex>.cu (for Nsight Compute's source view).
 * Returns 0 or -1 (mla_err): callers treat a failed write as a warning. */
int mla_rtc_cache_write(const char *dir, const char hex[MLA_RTC_KEY_HEX], const mla_rtc_binary *b,
                        const mla_rtc_text *save_source);

/* XXH3-128 of a buffer as 32 hex digits (exposed for tests and tools). */
void mla_rtc_hash_hex(const void *data, size_t len, char hex[MLA_RTC_KEY_HEX]);

#ifdef __cplusplus
}
#endif
#endif
