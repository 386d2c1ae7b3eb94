/*
 * lru.h — an intrusive least-recently-used list, shared by the state cache and the LRU map
 * (lru_map.h).
 *
 * An entry embeds a squad_lru_node; the list links nodes from the oldest (evicted first) to the
 * newest. SQUAD_LRU_ENTRY turns a node back into its entry. O(1) unlink and push, no allocation.
 */
#ifndef SQUAD_LRU_H
#define SQUAD_LRU_H

#include <stddef.h>

typedef struct squad_lru_node {
    struct squad_lru_node *prev; /* toward the oldest */
    struct squad_lru_node *next; /* toward the newest */
} squad_lru_node;

typedef struct squad_lru {
    squad_lru_node *oldest, *newest;
} squad_lru;

/* The entry of type `type` whose member `member` is the node n (NULL for a NULL node). */
#define SQUAD_LRU_ENTRY(n, type, member) ((n) ? (type *)(void *)((char *)(n) - offsetof(type, member)) : (type *)NULL)

static inline void squad_lru_unlink(squad_lru *l, squad_lru_node *n) {
    if (n->prev) n->prev->next = n->next;
    else l->oldest = n->next;
    if (n->next) n->next->prev = n->prev;
    else l->newest = n->prev;
    n->prev = n->next = NULL;
}

/* Appends n as the most recently used (n must not be in a list). */
static inline void squad_lru_push_newest(squad_lru *l, squad_lru_node *n) {
    n->prev = l->newest;
    n->next = NULL;
    if (l->newest) l->newest->next = n;
    else l->oldest = n;
    l->newest = n;
}

#endif /* SQUAD_LRU_H */
