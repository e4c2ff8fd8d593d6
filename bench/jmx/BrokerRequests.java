/*
 * The broker's own counts of what it was asked, per second over a window:
 * requests by type (Produce, Fetch, Metadata...) and the topic totals
 * (messages in, bytes in and out, and partition reads in fetches and
 * produces: TotalFetchRequestsPerSec counts one per partition per fetch).
 * Tells a benchmark's layout from its floor's by what the broker serves
 * (docs/architecture.md, "The busy tenants' topics as the platform lays
 * them out").
 *
 * The development broker runs without JMX; open it for the broker's life
 * (local, no authentication: a development machine only):
 *
 *   jcmd <broker pid> ManagementAgent.start jmxremote.port=29995 \
 *       jmxremote.rmi.port=29995 jmxremote.authenticate=false jmxremote.ssl=false
 *
 * then, while a benchmark's window is open (Java runs a single source file):
 *
 *   java bench/jmx/BrokerRequests.java 29995 20
 */
import java.util.HashMap;
import java.util.Map;
import java.util.TreeSet;
import javax.management.MBeanServerConnection;
import javax.management.ObjectName;
import javax.management.remote.JMXConnector;
import javax.management.remote.JMXConnectorFactory;
import javax.management.remote.JMXServiceURL;

public class BrokerRequests {
    private static final String[] TOPIC_TOTALS = {
        "MessagesInPerSec", "BytesInPerSec", "BytesOutPerSec",
        "TotalProduceRequestsPerSec", "TotalFetchRequestsPerSec",
    };

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: java BrokerRequests.java <jmx port> <seconds>");
            System.exit(2);
        }
        JMXServiceURL url = new JMXServiceURL(
            "service:jmx:rmi:///jndi/rmi://127.0.0.1:" + args[0] + "/jmxrmi");
        try (JMXConnector connector = JMXConnectorFactory.connect(url)) {
            MBeanServerConnection broker = connector.getMBeanServerConnection();
            Map<String, Long> before = counts(broker);
            long start = System.nanoTime();
            Thread.sleep(Long.parseLong(args[1]) * 1000);
            Map<String, Long> after = counts(broker);
            double seconds = (System.nanoTime() - start) / 1e9;
            for (String name : new TreeSet<>(after.keySet())) {
                long delta = after.get(name) - before.getOrDefault(name, 0L);
                if (delta > 0) {
                    System.out.printf("%-45s %12.1f/s%n", name, delta / seconds);
                }
            }
        }
    }

    /** The meters' running counts (each since the broker started). */
    private static Map<String, Long> counts(MBeanServerConnection broker) throws Exception {
        Map<String, Long> counts = new HashMap<>();
        ObjectName requests =
            new ObjectName("kafka.network:type=RequestMetrics,name=RequestsPerSec,*");
        for (ObjectName meter : broker.queryNames(requests, null)) {
            // One meter per request type and version: summed by type.
            counts.merge("requests " + meter.getKeyProperty("request"),
                ((Number) broker.getAttribute(meter, "Count")).longValue(), Long::sum);
        }
        for (String name : TOPIC_TOTALS) {
            ObjectName meter = new ObjectName("kafka.server:type=BrokerTopicMetrics,name=" + name);
            counts.put("topics " + name, ((Number) broker.getAttribute(meter, "Count")).longValue());
        }
        return counts;
    }
}
