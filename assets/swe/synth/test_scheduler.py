import unittest

from PKG import scheduler


class TestScheduler(unittest.TestCase):
    def test_priority_order(self):
        s = scheduler.Scheduler()
        s.submit(scheduler.Task("low", 1, 1))
        s.submit(scheduler.Task("high", 9, 1))
        self.assertEqual(s.next_task().name, "high")

    def test_ties_fifo(self):
        s = scheduler.Scheduler()
        s.submit(scheduler.Task("first", 2, 1))
        s.submit(scheduler.Task("second", 2, 1))
        self.assertEqual(s.next_task().name, "first")

    def test_empty(self):
        self.assertIsNone(scheduler.Scheduler().next_task())

    def test_pending(self):
        s = scheduler.Scheduler()
        s.submit(scheduler.Task("a", 1, 1))
        s.submit(scheduler.Task("b", 1, 1))
        s.next_task()
        self.assertEqual(s.pending(), 1)

    def test_plan(self):
        tasks = [scheduler.Task("a", 1, 3), scheduler.Task("b", 5, 4), scheduler.Task("c", 3, 2)]
        self.assertEqual(scheduler.plan(tasks, 6), ["b", "c"])

    def test_plan_exact_budget(self):
        tasks = [scheduler.Task("a", 2, 3), scheduler.Task("b", 1, 3)]
        self.assertEqual(scheduler.plan(tasks, 6), ["a", "b"])

    def test_plan_skips_large(self):
        tasks = [scheduler.Task("big", 9, 10), scheduler.Task("small", 1, 2)]
        self.assertEqual(scheduler.plan(tasks, 5), ["small"])
