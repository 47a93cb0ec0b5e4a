/*
 * test_idmap.c - the map of message ids shared by a process's sessions: scopes are apart, an
 * entry re-made is told from the old one, an entry keeps its address as the map grows, the bound
 * holds, and the entry put longest ago is the one forgotten (so a processing list's entry, put
 * at every move, outlives a million jobs).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "proxy/resp/idmap.h"

static int teardown(void **state)
{
    (void)state;
    idmap_clear();
    return 0;
}

static struct job_memo *put(const char *scope, const char *key)
{
    return idmap_put(scope, key, strlen(key));
}

static struct job_memo *get(const char *scope, const char *key)
{
    return idmap_get(scope, key, strlen(key));
}

/* The same id on two listeners is two entries; a key may hold any byte. */
static void test_scopes_apart(void **state)
{
    (void)state;
    struct job_memo *a = put("amqp", "job-1");
    assert_non_null(a);
    job_memo_set(&a->task, "charge", 6);
    struct job_memo *b = put("redis", "job-1");
    assert_non_null(b);
    assert_ptr_not_equal(a, b);
    assert_null(b->task);
    assert_ptr_equal(get("amqp", "job-1"), a);
    assert_string_equal(get("amqp", "job-1")->task, "charge");
    assert_null(get("amqp", "job-2"));
    /* A scope that is a prefix of another does not meet it. */
    assert_null(get("amq", "pjob-1"));
    assert_non_null(idmap_put("redis", "a\0b", 3));
    assert_null(get("redis", "a"));
    assert_non_null(idmap_get("redis", "a\0b", 3));
    assert_int_equal(idmap_count(), 3);
}

/* Put again, an entry is the same one; deleted and put, it is a new one with another gen. */
static void test_remade_entry_has_new_gen(void **state)
{
    (void)state;
    struct job_memo *a = put("s", "job");
    uint64_t gen = a->gen;
    assert_ptr_equal(put("s", "job"), a);
    assert_int_equal(put("s", "job")->gen, gen);
    idmap_del("s", "job", 3);
    assert_null(get("s", "job"));
    assert_int_equal(idmap_count(), 0);
    assert_true(put("s", "job")->gen != gen);
}

/* An entry keeps its address while the map grows round it and others come and go: a module
 * may hold the memo idmap_put gave across its other puts under the lock. */
static void test_entry_stays_put(void **state)
{
    (void)state;
    char key[32];
    struct job_memo *a = put("s", "held");
    job_memo_set(&a->queue, "default", 7);
    for (unsigned i = 0; i < 100000; i++) {
        snprintf(key, sizeof(key), "job-%u", i);
        assert_non_null(put("s", key));
        if (i % 3 == 0)
            idmap_del("s", key, strlen(key));
    }
    assert_ptr_equal(get("s", "held"), a);
    assert_string_equal(a->queue, "default");
    assert_int_equal(idmap_count(), 1 + 100000 - 33334);
}

/* Past IDMAP_MAX entries the map forgets the one put longest ago, not the one made first. */
static void test_bound_forgets_put_longest_ago(void **state)
{
    (void)state;
    char key[32];
    put("s", "processing");
    for (unsigned i = 0; i < IDMAP_MAX - 1; i++) {
        snprintf(key, sizeof(key), "job-%u", i);
        assert_non_null(put("s", key));
        if (i % 1000 == 0)
            put("s", "processing"); /* fed on, as a move onto it puts it */
    }
    assert_int_equal(idmap_count(), IDMAP_MAX);
    assert_non_null(put("s", "job-new"));
    assert_int_equal(idmap_count(), IDMAP_MAX);
    assert_non_null(get("s", "processing"));
    assert_null(get("s", "job-0"));
    assert_non_null(get("s", "job-1"));
    /* Held to its bound from now on. */
    for (unsigned i = 0; i < 10; i++) {
        snprintf(key, sizeof(key), "more-%u", i);
        put("s", key);
    }
    assert_int_equal(idmap_count(), IDMAP_MAX);
    assert_null(get("s", "job-10"));
    assert_non_null(get("s", "job-11"));
    assert_non_null(get("s", "processing"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_scopes_apart, teardown),
        cmocka_unit_test_teardown(test_remade_entry_has_new_gen, teardown),
        cmocka_unit_test_teardown(test_entry_stays_put, teardown),
        cmocka_unit_test_teardown(test_bound_forgets_put_longest_ago, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
