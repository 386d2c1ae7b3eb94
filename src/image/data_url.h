/*
 * data_url.h — image bytes from text: strict base64 and data: URLs (how the APIs carry images).
 *
 * Base64 is RFC 4648's standard alphabet with '=' padding; ASCII whitespace (space, tab, CR, LF)
 * between characters is skipped, as browsers' atob and the base64 tool's wrapped lines need.
 * Anything else is an error that says where: another alphabet's characters ('-', '_'), missing
 * or misplaced padding, a length that cannot be base64, and non-zero bits in the padding (a
 * non-canonical encoding, which no encoder writes).
 *
 * A data: URL must say base64 and an image media type squad decodes (image/png, image/jpeg,
 * image/jpg, image/webp); other parameters (";charset=...", ";name=...") are skipped. The bytes
 * are then decoded by their magic bytes (decode.h), not by the declared type. squad fetches
 * nothing: an http(s) URL is refused with its own message.
 */
#ifndef SQUAD_IMAGE_DATA_URL_H
#define SQUAD_IMAGE_DATA_URL_H

#include <stddef.h>
#include <stdint.h>

#include "squad.h"

/* Decodes len characters of base64 into a new buffer (*out, *out_len; free with free()). */
int squad_base64_decode(const char *text, size_t len, uint8_t **out, size_t *out_len, squad_err *err);

/* The bytes of a "data:image/...;base64,..." URL. */
int squad_data_url_decode(const char *text, size_t len, uint8_t **out, size_t *out_len, squad_err *err);

/* An image given as text in a request: a data: URL, or bare base64. An http(s) URL is an error. */
int squad_image_text_bytes(const char *text, size_t len, uint8_t **out, size_t *out_len, squad_err *err);

#endif /* SQUAD_IMAGE_DATA_URL_H */
