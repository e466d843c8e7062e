import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.ArrayDeque;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryOneTime;

/**
 * A Curator client driven line by line, for the interoperation cases of
 * backend-zk/tests/faults.rs. Run as a source file:
 * {@code java -cp <curator, zookeeper, guava, slf4j jars> CuratorProbe.java CONNECT PATH ID}.
 *
 * <p>It prints {@code ready} once connected, then answers one line per
 * command read on stdin:
 * <ul>
 * <li>{@code campaign}: starts a {@code LeaderLatch} on PATH with ID; {@code queued} once its node exists;
 * <li>{@code await-leader MS}: {@code leader} or {@code not-leader} after waiting up to MS;
 * <li>{@code is-leader}: {@code leader} or {@code not-leader} now;
 * <li>{@code leader}: {@code leader=<id>} as {@code LeaderLatch.getLeader} reads it ({@code leader=} with none);
 * <li>{@code resign}: closes the latch; {@code resigned};
 * <li>{@code lock MS}: {@code InterProcessMutex.acquire} on PATH for up to MS; {@code locked} or {@code busy};
 * <li>{@code unlock}: {@code unlocked};
 * <li>{@code read MS} / {@code write MS}: {@code InterProcessReadWriteLock}'s read or write lock on
 *     PATH for up to MS; {@code locked} or {@code busy};
 * <li>{@code unread} / {@code unwrite}: {@code unlocked};
 * <li>{@code permit N MS}: a lease of an {@code InterProcessSemaphoreV2} of N on PATH for up to MS;
 *     {@code locked} or {@code busy};
 * <li>{@code unpermit}: returns the latest lease; {@code unlocked}.
 * </ul>
 * End of input closes everything and exits 0.
 */
public class CuratorProbe {
    public static void main(String[] args) throws Exception {
        CuratorFramework client =
                CuratorFrameworkFactory.newClient(args[0], 30000, 10000, new RetryOneTime(200));
        client.start();
        if (!client.blockUntilConnected(20, TimeUnit.SECONDS)) {
            System.out.println("not-connected");
            System.exit(1);
        }
        String path = args[1];
        String id = args[2];
        LeaderLatch latch = null;
        InterProcessMutex mutex = new InterProcessMutex(client, path);
        InterProcessReadWriteLock rw = new InterProcessReadWriteLock(client, path);
        ArrayDeque<Lease> leases = new ArrayDeque<>();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        System.out.println("ready");
        System.out.flush();
        String line;
        while ((line = in.readLine()) != null) {
            String[] word = line.trim().split(" ", 2);
            String reply;
            switch (word[0]) {
                case "campaign":
                    latch = new LeaderLatch(client, path, id);
                    latch.start();
                    while (latch.getOurPath() == null) {
                        Thread.sleep(10);
                    }
                    reply = "queued";
                    break;
                case "await-leader":
                    reply = latch.await(Long.parseLong(word[1]), TimeUnit.MILLISECONDS)
                            ? "leader" : "not-leader";
                    break;
                case "is-leader":
                    reply = latch.hasLeadership() ? "leader" : "not-leader";
                    break;
                case "leader":
                    LeaderLatch reader = latch != null ? latch : new LeaderLatch(client, path, id);
                    reply = "leader=" + reader.getLeader().getId();
                    break;
                case "resign":
                    latch.close();
                    latch = null;
                    reply = "resigned";
                    break;
                case "lock":
                    reply = mutex.acquire(Long.parseLong(word[1]), TimeUnit.MILLISECONDS)
                            ? "locked" : "busy";
                    break;
                case "unlock":
                    mutex.release();
                    reply = "unlocked";
                    break;
                case "read":
                    reply = rw.readLock().acquire(Long.parseLong(word[1]), TimeUnit.MILLISECONDS)
                            ? "locked" : "busy";
                    break;
                case "unread":
                    rw.readLock().release();
                    reply = "unlocked";
                    break;
                case "write":
                    reply = rw.writeLock().acquire(Long.parseLong(word[1]), TimeUnit.MILLISECONDS)
                            ? "locked" : "busy";
                    break;
                case "unwrite":
                    rw.writeLock().release();
                    reply = "unlocked";
                    break;
                case "permit": {
                    String[] arg = word[1].split(" ");
                    InterProcessSemaphoreV2 sem =
                            new InterProcessSemaphoreV2(client, path, Integer.parseInt(arg[0]));
                    Lease lease = sem.acquire(Long.parseLong(arg[1]), TimeUnit.MILLISECONDS);
                    if (lease != null) {
                        leases.push(lease);
                    }
                    reply = lease != null ? "locked" : "busy";
                    break;
                }
                case "unpermit":
                    leases.pop().close();
                    reply = "unlocked";
                    break;
                default:
                    reply = "unknown " + word[0];
            }
            System.out.println(reply);
            System.out.flush();
        }
        if (latch != null) {
            latch.close();
        }
        client.close();
    }
}
