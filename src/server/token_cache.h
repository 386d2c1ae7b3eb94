/*
 * token_cache.h — the server's token cache: the tokenizer's text cache hook (tokenizer.h) over a
 * locked LRU map (lru_map.h), so a state or a system message sent again is not encoded again.
 *
 * The key is the encode flags and the text; the value the text's token ids. Texts shorter than
 * SRV_TOKEN_CACHE_MIN_BYTES are encoded every time: they cost less to encode than to look up and
 * keep. Several connection threads encode at once; the map's lock serialises the cache alone.
 */
#ifndef SQUAD_SERVER_TOKEN_CACHE_H
#define SQUAD_SERVER_TOKEN_CACHE_H

#include "lru_map.h"
#include "tokenizer.h"

#define SRV_TOKEN_CACHE_MIN_BYTES 1024

/* Attaches map (made with SQUAD_LRU_MAP_LOCKED, outliving the attachment) as tok's text cache for
 * texts of at least min_bytes; NULL detaches. Call before other threads encode. */
void srv_token_cache_attach(squad_tokenizer *tok, squad_lru_map *map, size_t min_bytes);

#endif /* SQUAD_SERVER_TOKEN_CACHE_H */
