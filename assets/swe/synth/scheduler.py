"""Task scheduling by priority within a time budget."""

import heapq


class Task:
    """A unit of work."""

    def __init__(self, name, priority, duration):
        self.name = name
        self.priority = priority
        self.duration = duration


class Scheduler:
    """Runs tasks with the highest priority first (ties by insertion order)."""

    def __init__(self):
        self._heap = []
        self._counter = 0

    def submit(self, task):
        """Queue a task."""
        heapq.heappush(self._heap, (-task.priority, self._counter, task))
        self._counter += 1

    def next_task(self):
        """Remove and return the next task, or None when empty."""
        if not self._heap:
            return None
        return heapq.heappop(self._heap)[2]

    def pending(self):
        """Number of queued tasks."""
        return len(self._heap)


def plan(tasks, budget):
    """Names of tasks run in priority order while their total duration fits in budget."""
    scheduler = Scheduler()
    for task in tasks:
        scheduler.submit(task)
    used = 0
    names = []
    while scheduler.pending() > 0:
        task = scheduler.next_task()
        if used + task.duration > budget:
            continue
        used += task.duration
        names.append(task.name)
    return names
